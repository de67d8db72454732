#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# Prepare the rdma-core tree the provider is built against (Debian trixie's version, which the
# guest runs) in the cache and print its path on stdout:
#
#   $CACHE/rdma-core-<version>/          unpacked upstream source (libibverbs/driver.h, ...)
#   $CACHE/rdma-core-<version>/build/    cmake -GNinja build: include/ (generated kern-abi
#                                        headers + driver.h), lib/libibverbs.so.1 (with the
#                                        IBVERBS_PRIVATE_<n> version script)
#
# The source comes from trixie through the private apt configuration of qemu-ci/common.sh; the
# host's apt configuration is not touched. A tree is reused once its .done marker exists.
# Usage: RDMA_CORE_SRC=$(rdma-core-provider/prepare-rdma-core.sh)
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../qemu-ci/common.sh"
stdout_is_result

# sha256 of rdma-core_$RDMA_CORE_VERSION.orig.tar.gz (apt checks it too; this pins the upstream).
ORIG_SHA256="63ce7f2baa7242c2dbc76375dac957c420187dd27f8c5e148efc07971ee522a8"

TREE="$CACHE/rdma-core-$RDMA_CORE_VERSION"
if cache_ready "$TREE"; then
	result "$TREE"
	exit 0
fi

exec 9>"$CACHE/rdma-core.lock"
flock 9
if cache_ready "$TREE"; then # somebody else finished it while we waited
	result "$TREE"
	exit 0
fi

for tool in cmake ninja pkg-config cc; do
	command -v "$tool" >/dev/null || die "$tool missing: run qemu-ci/setup-host.sh"
done

SRC_DIR="$CACHE/src/rdma-core"
ORIG="$SRC_DIR/rdma-core_$RDMA_CORE_VERSION.orig.tar.gz"
mkdir -p "$SRC_DIR"
if [ ! -f "$ORIG" ]; then
	log "downloading rdma-core $RDMA_CORE_VERSION source from $GUEST_SUITE"
	private_apt_init
	# Only the upstream tarball is needed. The .dsc has answered 404 on the mirror before, which
	# makes apt-get exit non-zero after fetching the tarballs, so judge by the file instead.
	(cd "$SRC_DIR" && private_apt source --download-only -qq rdma-core >&2) ||
		log "apt-get source reported an error; checking for the tarball anyway"
	[ -f "$ORIG" ] || die "no $(basename "$ORIG") from $GUEST_SUITE (did the suite move to another rdma-core?)"
fi
echo "$ORIG_SHA256  $ORIG" | sha256sum -c --quiet - >&2 || die "checksum mismatch for $ORIG"

log "unpacking and building rdma-core $RDMA_CORE_VERSION in $TREE"
rm -rf "$TREE"
mkdir -p "$TREE"
tar -xzf "$ORIG" -C "$TREE" --strip-components=1
# cmake records absolute paths, so configure in place; the .done marker guards completeness.
nice cmake -S "$TREE" -B "$TREE/build" -GNinja -Wno-dev \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 \
	>"$TREE/build-cmake.log" 2>&1 || die "cmake failed, see $TREE/build-cmake.log"
# kern-abi: the generated include/kernel-abi headers that driver.h needs; ibverbs: libibverbs.so.1
# (the provider links against it); ibverbs_tools: ibv_devices/ibv_devinfo, for manual runs.
nice ninja -C "$TREE/build" kern-abi ibverbs ibverbs_tools >"$TREE/build-ninja.log" 2>&1 ||
	die "ninja failed, see $TREE/build-ninja.log"
touch "$TREE/.done"
log "rdma-core $RDMA_CORE_VERSION ready"
result "$TREE"
