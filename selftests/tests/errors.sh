#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# RC error paths and data integrity between ns1 and ns2 through the stock pyverbs
# (selftests/py/errors.py): bad rkey, out of bounds, access rights, RNR (waited out and
# exceeded), unreachable peer (retry exceeded), then WRITE/READ/SEND_WITH_IMM/WRITE_WITH_IMM and
# the atomics byte-exact. The requester runs in ns1 on mroce1, the responder in ns2 on mroce2;
# they meet over TCP on 10.77.0.2.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce
PY="$(dirname "$0")/../py/errors.py"
PORT=18600

$IP netns exec ns2 timeout 300 python3 "$PY" --role server --dev mroce2 --port $PORT \
	>"$TAP_DIR/errors-server.out" 2>&1 &
srv=$!
$IP netns exec ns1 timeout 300 python3 "$PY" --role client --dev mroce1 --server $NS2_ADDR \
	--port $PORT >"$TAP_DIR/errors.out" 2>&1
rc=$?
# Each "ok - ..." / "not ok - ..." line of the client becomes one TAP result.
while IFS= read -r line; do
	case "$line" in
	"ok - "*) _tap 0 "${line#ok - }" ;;
	"not ok - "*) _tap 1 "${line#not ok - }" ;;
	"#"*) echo "$line" ;;
	*) echo "# $line" ;;
	esac
done <"$TAP_DIR/errors.out"
wait $srv
srv_rc=$?
if [ "$rc" != 0 ] || [ "$srv_rc" != 0 ]; then
	echo "# client exit $rc, server exit $srv_rc; the server said:"
	tail -n 30 "$TAP_DIR/errors-server.out" | sed 's/^/# /'
fi
check "the requester side ran to its end" grep -q '^# client: done' "$TAP_DIR/errors.out"
check "the responder side ran to its end" grep -q '^server: done' "$TAP_DIR/errors-server.out"
# The client exits 1 exactly when it printed a failed check, the server 0.
# errors_exit CLIENT SERVER: arguments, since check's own `rc` is local and would shadow ours.
errors_exit() {
	[ "$2" = 0 ] || return 1
	case "$1" in
	0) ! grep -q '^not ok - ' "$TAP_DIR/errors.out" ;;
	1) grep -q '^not ok - ' "$TAP_DIR/errors.out" ;;
	*) false ;;
	esac
}
check "errors.py exit statuses agree with its checks (client $rc, server $srv_rc)" \
	errors_exit "$rc" "$srv_rc"
for d in mroce1 mroce2; do
	echo "# $($RDMA statistic show link $d/1 2>&1 | tr -s ' \n' ' ')"
done

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
