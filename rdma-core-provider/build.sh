#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# Build the libibverbs provider from a clean clone: prepare rdma-core in the cache if needed
# (prepare-rdma-core.sh), cargo build --release, then stage the installable files in
# ${CARGO_TARGET_DIR:-<repo>/target}/metaroce-provider/ (`make install` puts them in place):
#
#   libmetaroce.so.1                     -> /usr/lib/x86_64-linux-gnu/libmetaroce.so.1
#   libmetaroce.so -> libmetaroce.so.1   the link for -lmetaroce (-L this directory)
#   libmetaroce-rdmav34.so -> libmetaroce.so.1
#                                           the plugin name; installed as libibverbs/libmetaroce-rdmav34.so
#                                           -> ../libmetaroce.so.1
#   include/infiniband/metaroce_dv.h     -> /usr/include/infiniband/metaroce_dv.h (-I.../include)
#   metaroce.driver                      -> /etc/libibverbs.d/metaroce.driver
#
# stdout: that directory, or with --print-so the path of libmetaroce.so.1. Logs go to stderr.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
source "$REPO/qemu-ci/common.sh"
stdout_is_result

print=dir
case "${1:-}" in
"") ;;
--print-so) print=so ;;
*) die "usage: $0 [--print-so]" ;;
esac

RDMA_CORE_SRC="$("$HERE/prepare-rdma-core.sh")"
export RDMA_CORE_SRC
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
(cd "$REPO" && nice cargo build --release -p metaroce-provider >&2)

OUT="$TARGET_DIR/metaroce-provider"
mkdir -p "$OUT"
SO="$OUT/libmetaroce.so.1"
install -m 0644 "$TARGET_DIR/release/libmetaroce_provider.so" "$SO.tmp" && mv "$SO.tmp" "$SO"
ln -sfn libmetaroce.so.1 "$OUT/libmetaroce.so"
ln -sfn libmetaroce.so.1 "$OUT/libmetaroce-rdmav34.so"
install -D -m 0644 "$HERE/metaroce_dv.h" "$OUT/include/infiniband/metaroce_dv.h"
install -m 0644 "$HERE/metaroce.driver" "$OUT/metaroce.driver"
case "$print" in
dir) result "$OUT" ;;
so) result "$SO" ;;
esac
