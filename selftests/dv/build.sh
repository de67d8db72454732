#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# Build metaroce_dv_test (the direct verbs' guest test) on the host; the guest has no compiler.
# The host's gcc compiles it against the prepared rdma-core tree's headers and the staged
# <infiniband/metaroce_dv.h>, and links it against that tree's libibverbs.so.1 and the staged
# libmetaroce.so.1 (rdma-core-provider/build.sh, run first), with no RPATH: in the guest both
# come from /usr/lib/x86_64-linux-gnu. Bookworm's glibc is older than the guest's (trixie),
# so the binary runs there. `make payload` installs it as /usr/local/bin/metaroce_dv_test.
#
# stdout: the binary's path, ${CARGO_TARGET_DIR:-<repo>/target}/metaroce-dv/metaroce_dv_test.
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
BIN="$OUT/metaroce_dv_test"
mkdir -p "$OUT"

# rdma-core's headers as system headers: the warnings are for our code only.
"${CC:-gcc}" -std=gnu11 -O2 -g -Wall -Wextra -Werror -isystem "$RC_BUILD/include" -I"$STAGE/include" \
	"$HERE/metaroce_dv_test.c" -o "$BIN.tmp" \
	-L"$STAGE" -lmetaroce -L"$RC_BUILD/lib" -libverbs || die "building metaroce_dv_test"
dyn="$(readelf -d "$BIN.tmp")"
grep -q 'NEEDED.*\[libmetaroce\.so\.1\]' <<<"$dyn" || die "metaroce_dv_test: no NEEDED libmetaroce.so.1"
grep -q 'NEEDED.*\[libibverbs\.so\.1\]' <<<"$dyn" || die "metaroce_dv_test: no NEEDED libibverbs.so.1"
if grep -Eq 'RPATH|RUNPATH' <<<"$dyn"; then die "metaroce_dv_test has an RPATH/RUNPATH"; fi
mv "$BIN.tmp" "$BIN"
result "$BIN"
