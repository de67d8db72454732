#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# Host checks of the provider (no RDMA device needed): rustfmt, clippy, unit tests, then the
# built library: ELF checks (versioned IBVERBS_PRIVATE_34 references, NEEDED libibverbs.so.1,
# SONAME libmetaroce.so.1, exactly the direct verbs exported, versioned METAROCE_1.0), the
# public header metaroce_dv.h as C and C++, and check/load-check.c, which dlopens it through
# the plugin name against rdma-core's libibverbs, inspects what its constructor registered and
# drives it (extended and direct verbs included) against a fake uverbs device, once with the
# rdma-core build tree's libibverbs and once with Debian trixie's libibverbs1 and glibc.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
source "$REPO/qemu-ci/common.sh"

SO="$("$HERE/build.sh" --print-so)"
STAGE="$(dirname "$SO")"
PLUGIN="$STAGE/libmetaroce-rdmav34.so"
RDMA_CORE_SRC="$("$HERE/prepare-rdma-core.sh")"
export RDMA_CORE_SRC
RC_BUILD="$RDMA_CORE_SRC/build"
fail() { log "provider check FAILED: $*"; exit 1; }

cd "$REPO"
log "rustfmt"
cargo fmt -p metaroce-provider --check >&2 || fail "rustfmt"
log "clippy"
nice cargo clippy -p metaroce-provider --all-targets -- -D warnings >&2 || fail "clippy"
log "unit tests"
nice cargo test -p metaroce-provider >&2 || fail "unit tests"

log "ELF checks on $SO"
dynsyms="$(objdump -T "$SO")"
for sym in verbs_register_driver_34 ibv_cmd_get_context _verbs_init_and_alloc_context \
	verbs_set_ops verbs_uninit_context ibv_cmd_query_device_any ibv_cmd_query_port \
	ibv_cmd_alloc_pd ibv_cmd_dealloc_pd ibv_cmd_reg_mr ibv_cmd_dereg_mr ibv_cmd_create_cq \
	ibv_cmd_destroy_cq ibv_cmd_req_notify_cq ibv_cmd_create_qp ibv_cmd_query_qp \
	ibv_cmd_modify_qp ibv_cmd_destroy_qp ibv_cmd_create_srq ibv_cmd_modify_srq \
	ibv_cmd_query_srq ibv_cmd_destroy_srq ibv_cmd_modify_qp_ex ibv_cmd_create_cq_ex \
	ibv_cmd_create_qp_ex; do
	grep -Eq "\*UND\*.*[[:space:]]\(?IBVERBS_PRIVATE_34\)?[[:space:]]+$sym\$" <<<"$dynsyms" ||
		fail "$sym@IBVERBS_PRIVATE_34 is not referenced"
done
# Exported: exactly the direct verbs of metaroce_dv.h, each with its default version
# (METAROCE_1.0, METAROCE_1.1 for those added later) and the version nodes themselves
# (libibverbs finds the provider through the constructor, not by symbol).
DV_SYMS_1_0="metaroce_dv_is_supported metaroce_dv_query_qp metaroce_dv_set_qp_planes"
DV_SYMS_1_1="metaroce_dv_qp_rings metaroce_dv_qp_doorbell"
DV_SYMS="$DV_SYMS_1_0 $DV_SYMS_1_1"
exported="$(nm -D --defined-only "$SO" | awk '{print $NF}' | grep -v '^METAROCE_1\.[01]$' | sort)"
want="$( (for sym in $DV_SYMS_1_0; do echo "$sym@@METAROCE_1.0"; done
	for sym in $DV_SYMS_1_1; do echo "$sym@@METAROCE_1.1"; done) | sort)"
[ "$exported" = "$want" ] || fail "exported symbols: $(echo $exported), expected: $(echo $want)"
for sym in $DV_SYMS; do
	grep -Eq "[ *]$sym\(" "$HERE/metaroce_dv.h" || fail "$sym is not declared in metaroce_dv.h"
done
readelf -d "$SO" | grep -q 'NEEDED.*\[libibverbs\.so\.1\]' || fail "no NEEDED libibverbs.so.1"
readelf -d "$SO" | grep -q 'SONAME.*\[libmetaroce\.so\.1\]' || fail "wrong SONAME"
if readelf -d "$SO" | grep -Eq 'RPATH|RUNPATH'; then fail "the library has an RPATH/RUNPATH"; fi
[ "$(readlink "$PLUGIN")" = libmetaroce.so.1 ] || fail "$PLUGIN is not a symlink to libmetaroce.so.1"
# glibc of the build host (bookworm, 2.36) is older than the guest's (trixie, 2.41).
maxglibc=$(objdump -T "$SO" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)
log "needs at most $maxglibc"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# The staged header stands alone (included twice), as C and C++; -pedantic for it, not for
# rdma-core's headers (-isystem).
log "metaroce_dv.h as C and C++"
printf '#include <infiniband/metaroce_dv.h>\n#include <infiniband/metaroce_dv.h>\n' >"$TMP/h.c"
for compiler in "cc -std=c99" "c++ -std=c++11 -x c++"; do
	$compiler -Wall -Wextra -Werror -pedantic -fsyntax-only -isystem "$RC_BUILD/include" \
		-I"$STAGE/include" "$TMP/h.c" || fail "metaroce_dv.h does not compile with $compiler"
done

log "load check"
CHECK_BIN="$TMP/load-check"
cc -Wall -O1 -I"$RC_BUILD/include" -I"$REPO/uapi" -I"$HERE" "$HERE/check/load-check.c" \
	-o "$CHECK_BIN" -rdynamic -L"$RC_BUILD/lib" -libverbs -ldl || fail "building load-check"
LD_LIBRARY_PATH="$RC_BUILD/lib" "$CHECK_BIN" "$PLUGIN" "$SO" >&2 || fail "load-check"

# Again with the binaries the guest runs: Debian trixie's libibverbs1 and glibc, unpacked into
# the cache (private apt) and used through trixie's dynamic loader, no chroot needed.
TRIXIE="$CACHE/trixie-libibverbs1-$RDMA_CORE_VERSION"
if ! cache_ready "$TRIXIE"; then
	log "fetching trixie's libibverbs1 and glibc into $TRIXIE"
	rm -rf "$TRIXIE" && mkdir -p "$TRIXIE/debs"
	private_apt_init
	(cd "$TRIXIE/debs" && private_apt download -qq libc6 libgcc-s1 libibverbs1 \
		libnl-3-200 libnl-route-3-200 >&2) || fail "downloading trixie debs"
	ver=$(dpkg-deb -f "$TRIXIE"/debs/libibverbs1_*.deb Version)
	[[ "$ver" == "$RDMA_CORE_VERSION"-* ]] || fail "trixie has libibverbs1 $ver, not $RDMA_CORE_VERSION"
	for deb in "$TRIXIE"/debs/*.deb; do dpkg-deb -x "$deb" "$TRIXIE/root"; done
	touch "$TRIXIE/.done"
fi
TLIB="$TRIXIE/root/usr/lib/x86_64-linux-gnu"
log "load check with trixie's libibverbs1 $(dpkg-deb -f "$TRIXIE"/debs/libibverbs1_*.deb Version)"
"$TLIB/ld-linux-x86-64.so.2" --library-path "$TLIB" "$CHECK_BIN" "$PLUGIN" "$SO" >&2 ||
	fail "load-check with trixie's libibverbs1"
log "provider checks passed"
