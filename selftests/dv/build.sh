#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# Build the direct verbs' guest test programs on the host; the guest has no compiler:
# metaroce_dv_test (the direct verbs against the real module), metaroce_hostile_test (a
# malicious application writing into its QPs' rings, selftests/tests/hostile.sh) and
# metaroce_mcast_test (multicast for UD QPs through the plain verbs, selftests/tests/ud.sh).
# The host's gcc compiles each against the prepared rdma-core tree's headers and the staged
# <infiniband/metaroce_dv.h>, and links it against that tree's libibverbs.so.1 and the staged
# libmetaroce.so.1 (rdma-core-provider/build.sh, run first), with no RPATH: in the guest both
# come from /usr/lib/x86_64-linux-gnu. Bookworm's glibc is older than the guest's (trixie),
# so the binaries run there. `make payload` installs them in /usr/local/bin.
#
# stdout: the binaries' paths, one a line, in ${CARGO_TARGET_DIR:-<repo>/target}/metaroce-dv/.
# Logs go to stderr.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
source "$REPO/qemu-ci/common.sh"
stdout_is_result

STAGE="$("$REPO/rdma-core-provider/build.sh")"
RDMA_CORE_SRC="$("$REPO/rdma-core-provider/prepare-rdma-core.sh")"
RC_BUILD="${RDMA_CORE_BUILD:-$RDMA_CORE_SRC/build}"
OUT="${CARGO_TARGET_DIR:-$REPO/target}/metaroce-dv"
mkdir -p "$OUT"

bins=()
for prog in metaroce_dv_test metaroce_hostile_test metaroce_mcast_test; do
	BIN="$OUT/$prog"
	# rdma-core's headers as system headers: the warnings are for our code only.
	"${CC:-gcc}" -std=gnu11 -O2 -g -Wall -Wextra -Werror -isystem "$RC_BUILD/include" \
		-I"$STAGE/include" "$HERE/$prog.c" -o "$BIN.tmp" \
		-L"$STAGE" -lmetaroce -L"$RC_BUILD/lib" -libverbs || die "building $prog"
	dyn="$(readelf -d "$BIN.tmp")"
	grep -q 'NEEDED.*\[libmetaroce\.so\.1\]' <<<"$dyn" || die "$prog: no NEEDED libmetaroce.so.1"
	grep -q 'NEEDED.*\[libibverbs\.so\.1\]' <<<"$dyn" || die "$prog: no NEEDED libibverbs.so.1"
	if grep -Eq 'RPATH|RUNPATH' <<<"$dyn"; then die "$prog has an RPATH/RUNPATH"; fi
	mv "$BIN.tmp" "$BIN"
	bins+=("$BIN")
done
result "$(printf '%s\n' "${bins[@]}")"
