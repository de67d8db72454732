#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Install what the build needs on a Debian bookworm host, only what is missing. Idempotent and
# quick when everything is there. The host's apt sources are never changed.
source "$(dirname "$0")/common.sh"

PKGS=(
	"clang-$LLVM_VERSION" "libclang-$LLVM_VERSION-dev" "lld-$LLVM_VERSION" "llvm-$LLVM_VERSION"
	bison flex libelf-dev libssl-dev cpio kmod bc zstd rsync dwarves
	qemu-system-x86 debootstrap e2fsprogs
	cmake ninja-build pkg-config libnl-3-dev libnl-route-3-dev libudev-dev python3-docutils
	gcc libc6-dev binutils # cc: rdma-core's cmake, cargo's linker, rdma-core-provider/check.sh
)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	log "installing host packages: ${missing[*]}"
	[ "$(id -u)" = 0 ] || die "need root to install packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# The toolchain is pinned by rust-toolchain.toml; the kernel build needs rust-src.
(cd "$REPO_DIR" && rustup component list --installed 2>/dev/null | grep -q '^rust-src') ||
	(cd "$REPO_DIR" && rustup component add rust-src >&2)

if ! bindgen --version 2>/dev/null | grep -q "$BINDGEN_VERSION"; then
	log "installing bindgen-cli $BINDGEN_VERSION"
	cargo install --locked bindgen-cli --version "$BINDGEN_VERSION" >&2
fi
