#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build the test kernel (Linux 7.3 from Debian's linux-source-7.3, CONFIG_RUST=y) into the cache.
#
#   qemu-ci/build-kernel.sh            prints the build directory (KDIR) on stdout
#   KERNEL_PROFILE=debug ...           lockdep, KASAN, kmemleak, DEBUG_LIST, ...
#
# The build directory is keyed by the source package version, the config fragments and the
# toolchain versions; a warm run only checks the .done marker.
source "$(dirname "$0")/common.sh"
stdout_is_result

PROFILE="${KERNEL_PROFILE:-fast}"
case "$PROFILE" in fast | debug) ;; *) die "KERNEL_PROFILE must be fast or debug" ;; esac

"$QEMU_CI_DIR/setup-host.sh" >&2

# 1. The source package, fetched once through the private apt configuration.
SRC_CACHE="$CACHE/src"
mkdir -p "$SRC_CACHE"
deb=$(ls "$SRC_CACHE"/${KERNEL_PKG}_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
	log "downloading $KERNEL_PKG from $KERNEL_SUITE"
	private_apt_init
	(cd "$SRC_CACHE" && private_apt download -q "$KERNEL_PKG")
	deb=$(ls "$SRC_CACHE"/${KERNEL_PKG}_*.deb | head -n1)
fi
kver=$(dpkg-deb -f "$deb" Version)
SRCDIR="$SRC_CACHE/linux-${kver//[^A-Za-z0-9.+-]/_}"
if ! cache_ready "$SRCDIR"; then
	log "unpacking $KERNEL_PKG $kver"
	rm -rf "$SRCDIR" "$SRCDIR.tmp"
	mkdir -p "$SRCDIR.tmp"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$SRCDIR.tmp" --wildcards '*.tar.xz'
	tarball=$(find "$SRCDIR.tmp" -name 'linux-source-*.tar.xz' | head -n1)
	tar -xf "$tarball" -C "$SRCDIR.tmp"
	rm -f "$tarball"
	mv "$SRCDIR.tmp"/linux-source-*/ "$SRCDIR"
	rm -rf "$SRCDIR.tmp"
	touch "$SRCDIR/.done"
fi

# 2. The build, keyed by everything that changes its output.
fragments=("$QEMU_CI_DIR/kernel/metaroce.config")
[ "$PROFILE" = debug ] && fragments+=("$QEMU_CI_DIR/kernel/debug.config")
key=$(input_hash "$kver" "$PROFILE" "${fragments[@]}" "$(rustc --version)" \
	"$(clang --version | head -n1)" "$(bindgen --version)")
KDIR="$CACHE/kernel-$PROFILE-$key"
if cache_ready "$KDIR"; then
	result "$KDIR"
	exit 0
fi

log "building kernel $kver ($PROFILE) in $KDIR; about 15 minutes on 2 cores"
mkdir -p "$KDIR"
kmake() { make -C "$SRCDIR" O="$KDIR" LLVM=1 -j"$(nproc)" "$@"; }
kmake defconfig >&2
kmake kvm_guest.config >&2
"$SRCDIR/scripts/kconfig/merge_config.sh" -m -O "$KDIR" "$KDIR/.config" "${fragments[@]}" >&2
kmake olddefconfig >&2
# merge_config reports options that did not stick; these must.
for opt in RUST INFINIBAND INFINIBAND_USER_ACCESS RDMA_RXE NET_SCH_NETEM VETH NET_UDP_TUNNEL \
	IP_ROUTE_MULTIPATH 9P_FS VIRTIO_BLK NVME_RDMA NVME_TARGET_RDMA SUNRPC_XPRT_RDMA NFSD; do
	grep -Eq "^CONFIG_${opt}=(y|m)" "$KDIR/.config" || die "CONFIG_$opt is not set in $KDIR/.config"
done
kmake rustavailable >&2
kmake bzImage modules >&2
# Modules of the test kernel (rxe, ...) staged for the guest image.
rm -rf "$KDIR/modules-install"
kmake INSTALL_MOD_PATH="$KDIR/modules-install" INSTALL_MOD_STRIP=1 modules_install >&2
touch "$KDIR/.done"
result "$KDIR"
