# SPDX-License-Identifier: GPL-2.0
# Helpers for the selftests that run inside the guest. Source it.
#
# Results are TAP lines on stdout ("ok N - what" / "not ok N - what"), counted in $TAP_DIR so
# run.sh can print the plan and the closing "N passed, N failed" line. There are no expected
# failures: a check asserts or is not there, and a known limitation is documented (README), not
# reported as a TODO that cannot fail. A suite's last line is `suite_end`: run.sh fails a suite
# that never got there (a crash, a kill, an exit halfway), whose remaining checks would
# otherwise vanish without a trace.

TAP_DIR="${TAP_DIR:-/tmp/metaroce-tap}"
mkdir -p "$TAP_DIR"
[ -f "$TAP_DIR/n" ] || echo 0 >"$TAP_DIR/n"

# Stock tools only, by full path where busybox-style shadowing could bite.
IP=/usr/sbin/ip
RDMA=/usr/bin/rdma

_tap() { # status description
	local n
	n=$(($(cat "$TAP_DIR/n") + 1))
	echo "$n" >"$TAP_DIR/n"
	if [ "$1" = 0 ]; then
		echo "ok $n - $2"
		echo "$2" >>"$TAP_DIR/passed"
	else
		echo "not ok $n - $2"
		echo "$2" >>"$TAP_DIR/failed"
	fi
}

# suite_end: the suite ran to its last line (run.sh sets SUITE and checks for the mark).
suite_end() { [ -z "${SUITE:-}" ] || : >"$TAP_DIR/end-$SUITE"; }

# check "what" cmd args...: runs the command, output indented as TAP diagnostics on failure.
check() {
	local what="$1" out rc
	shift
	out=$("$@" 2>&1) && rc=0 || rc=$?
	if [ "$rc" != 0 ]; then
		printf '%s\n' "$out" | sed 's/^/# /' | tail -n 40
		echo "# (exit status $rc)"
	fi
	_tap "$rc" "$what"
	return 0
}

# check_output "what" "regex" cmd args...: the command succeeds and its output matches.
check_output() {
	local what="$1" re="$2" out rc
	shift 2
	out=$("$@" 2>&1) && rc=0 || rc=$?
	if [ "$rc" = 0 ] && ! printf '%s\n' "$out" | grep -Eq -- "$re"; then
		rc=1
	fi
	if [ "$rc" != 0 ]; then
		printf '%s\n' "$out" | sed 's/^/# /' | tail -n 40
		echo "# (wanted /$re/, exit status $rc)"
	fi
	_tap "$rc" "$what"
	return 0
}

# check_no_output "what" "regex" cmd args...: the command's output does not match.
check_no_output() {
	local what="$1" re="$2" out rc=0
	shift 2
	out=$("$@" 2>&1) || true
	if printf '%s\n' "$out" | grep -Eq -- "$re"; then
		printf '%s\n' "$out" | grep -E -- "$re" | sed 's/^/# /' | head -n 40
		rc=1
	fi
	_tap "$rc" "$what"
	return 0
}

# wait_for SECONDS cmd args...: polls until the command succeeds.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}

# Two hosts, ns1 and ns2, joined by a veth pair (veth1 in ns1, veth2 in ns2), addresses
# 10.77.0.1/24 and 10.77.0.2/24 (and fd77::1/2), each with a metaroce device made from inside
# its own namespace (default shared rdma netns mode): mroce1 and mroce2.
NS1_ADDR=10.77.0.1
NS2_ADDR=10.77.0.2
setup_pair() {
	local type="${1:-metaroce}" prefix="${2:-mroce}"
	$IP netns add ns1
	$IP netns add ns2
	$IP link add veth1 netns ns1 type veth peer name veth2 netns ns2
	$IP -n ns1 addr add $NS1_ADDR/24 dev veth1
	$IP -n ns2 addr add $NS2_ADDR/24 dev veth2
	$IP -n ns1 addr add fd77::1/64 dev veth1 nodad
	$IP -n ns2 addr add fd77::2/64 dev veth2 nodad
	$IP -n ns1 link set lo up
	$IP -n ns2 link set lo up
	$IP -n ns1 link set veth1 up
	$IP -n ns2 link set veth2 up
	$IP netns exec ns1 $RDMA link add ${prefix}1 type "$type" netdev veth1
	$IP netns exec ns2 $RDMA link add ${prefix}2 type "$type" netdev veth2
}

teardown_pair() {
	$IP netns del ns1 2>/dev/null || true
	$IP netns del ns2 2>/dev/null || true
	# Devices go with their netdevs; wait until the queued unregistrations are done.
	wait_for 10 sh -c "! $RDMA link show 2>/dev/null | grep -q 'mroce\|rxe'" || true
}

# Under TCG perftest's clock calibration sometimes fails (more often on a loaded host): after a
# transfer that went fine, perftest fits its cycle counter against gettimeofday to print its
# report, prints "Correlation coefficient r^2: ... < 0.9" and "Can't produce a report" on
# stderr, and exits 1. stderr is unbuffered, so in a log of both streams those lines come
# before the buffered report.
# perftest_uncalibrated FILE: FILE (a perftest client's output; - for stdin) shows it.
perftest_uncalibrated() { grep -q 'Correlation coefficient' "$1"; }
# perftest_errors FILE PREFIX: FILE's error lines (a failed calibration among them), each
# after PREFIX.
perftest_errors() { grep -iE 'correlation|produce a report|fail|error' "$1" | sed "s/^/$2/"; }

# gid_index DEV REGEX: the first GID index of DEV's port 1 whose GID matches REGEX.
gid_index() {
	local f
	for f in $(ls /sys/class/infiniband/"$1"/ports/1/gids/ | sort -n); do
		if grep -Eq -- "$2" /sys/class/infiniband/"$1"/ports/1/gids/"$f"; then
			echo "$f"
			return 0
		fi
	done
	return 1
}

# perftest "what" TOOL ARGS...: TOOL's server in ns2 on mroce2, its client in ns1 on mroce1
# (GID index PERF_GID, by default 1, the IPv4 RoCEv2 GID); both must succeed and the client must report a result
# line. Under TCG perftest's clock calibration sometimes fails (more often on a loaded host):
# such a run is retried, twice at most.
# The client's result line is kept in $TAP_DIR/last-result.
perftest() {
	local what="$1" tool="$2" try out rc srv
	shift 2
	for try in 1 2 3; do
		$IP netns exec ns2 timeout 120 "$tool" -d mroce2 -x "${PERF_GID:-1}" --report_gbits "$@" \
			>"$TAP_DIR/perf-server.log" 2>&1 &
		srv=$!
		sleep 1
		out=$($IP netns exec ns1 timeout 120 "$tool" -d mroce1 -x "${PERF_GID:-1}" --report_gbits "$@" \
			$NS2_ADDR 2>&1) && rc=0 || rc=$?
		wait $srv || rc=${rc/#0/server-failed}
		# Either end may fail its calibration: the server reports too with -b (bidirectional),
		# and its exit then closes the socket the client reads the server's report from
		# ("Couldn't read reports").
		if [ "$try" != 3 ] && { printf '%s\n' "$out" | perftest_uncalibrated - ||
			perftest_uncalibrated "$TAP_DIR/perf-server.log"; }; then
			continue
		fi
		break
	done
	printf '%s\n' "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' | tail -n 1 >"$TAP_DIR/last-result"
	if [ "$rc" != 0 ] || [ ! -s "$TAP_DIR/last-result" ]; then
		printf '%s\n' "$out" | grep -Ev '^ (GID|local address|remote address)|^-+$|^ [A-Za-z* ]+ +: ' | tail -n 15 | sed 's/^/# /'
		perftest_errors "$TAP_DIR/perf-server.log" '# server: '
		sed 's/^/# server: /' "$TAP_DIR/perf-server.log" | tail -n 5
		echo "# (exit status $rc)"
		_tap 1 "$what"
	else
		echo "# $(cat "$TAP_DIR/last-result")"
		_tap 0 "$what"
	fi
}

# Keeps the kernel's tc ingress/egress static keys on for the whole run (a clsact qdisc on the
# root namespace's lo, never removed): tests that add and remove clsact (link cuts) then only
# move a reference count. Flipping a static key patches kernel text, and under TCG that
# sometimes dies in an int3 oops when another vCPU runs the code being patched. The same for
# the key of software tc filters (tcf_sw_enabled_key, taken by the first such filter of any
# block: a cut's drop filter flipped it, and a bench run died in tc_run on it): a filter on lo's
# ingress that matches nothing (an Ethernet type no packet there has) holds it.
# The same for the UDP encapsulation keys (v4 and v6: every metaroce or rxe device's tunnel socket
# takes a reference, so each module load and unload flipped them) and the receive timestamp key
# (ping): one idle socket of each family holds them for the whole guest run.
pin_static_keys() {
	tc qdisc show dev lo 2>/dev/null | grep -q clsact || tc qdisc add dev lo clsact 2>/dev/null || true
	tc filter show dev lo ingress 2>/dev/null | grep -q . ||
		tc filter add dev lo ingress protocol 0x88b5 prio 65535 matchall action pass 2>/dev/null ||
		true
	[ -e /run/metaroce-pinned-keys ] && return 0
	# In a subshell: not a job of the caller's shell, whose bare `wait` would wait for it.
	(python3 -c '
import signal, socket
UDP_ENCAP, UDP_ENCAP_L2TPINUDP, SO_TIMESTAMP = 100, 3, 29  # linux/udp.h, asm-generic/socket.h
held = []
for family in (socket.AF_INET, socket.AF_INET6):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_UDP, UDP_ENCAP, UDP_ENCAP_L2TPINUDP)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    held.append(s)
open("/run/metaroce-pinned-keys", "w").close()
signal.pause()
' </dev/null >/dev/null 2>&1 &)
	for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e /run/metaroce-pinned-keys ] && break; sleep 0.2; done
}

# The kernel log since the test started, for oops/WARN/leak checks.
# net_bytes PID FIELD...: the time and byte counters of the network namespace PID is in, read
# in one go from /proc/PID/net/dev (no process started per sample: `ip netns exec` took over a
# second on a loaded guest): "<time ns> <value of each FIELD>", a FIELD tx:DEV or rx:DEV.
net_bytes() {
	local pid="$1"
	shift
	awk -v t="$EPOCHREALTIME" -v fields="$*" '
		(i = index($0, ":")) > 0 {
			name = substr($0, 1, i - 1); gsub(/ /, "", name)
			split(substr($0, i + 1), f, " "); v["rx:" name] = f[1]; v["tx:" name] = f[9]
		}
		END {
			split(t, T, "[.,]")
			printf "%s%06d000", T[1], T[2]
			n = split(fields, F, " ")
			for (k = 1; k <= n; k++) printf " %.0f", v[F[k]]
			printf "\n"
		}' "/proc/$pid/net/dev"
}

# net_window PID WAIT SECS FIRST LAST FIELD...: two net_bytes lines SECS seconds apart, the
# first once each of their columns FIRST..LAST (1 is the time; LAST 0: through the last) has
# moved 256 KiB since the call, or after WAIT seconds: a window every flow watched runs in.
net_window() {
	local pid="$1" wait="$2" secs="$3" first="$4" last="$5" base now deadline
	shift 5
	deadline=$((SECONDS + wait))
	base=$(net_bytes "$pid" "$@")
	while [ "$SECONDS" -lt "$deadline" ]; do
		sleep 0.3
		now=$(net_bytes "$pid" "$@")
		awk -v a="$base" -v b="$now" -v f="$first" -v l="$last" 'BEGIN {
			n = split(a, A, " "); split(b, B, " ")
			if (l == 0) l = n
			for (i = f; i <= l; i++) if (B[i] - A[i] < 262144) exit 1
		}' && break
	done
	net_bytes "$pid" "$@"
	sleep "$secs"
	net_bytes "$pid" "$@"
}

dmesg_mark() { dmesg | wc -l >"$TAP_DIR/dmesg-mark"; }
dmesg_since_mark() { dmesg | tail -n +"$(($(cat "$TAP_DIR/dmesg-mark" 2>/dev/null || echo 0) + 1))"; }
# A kernel general protection fault prints "general protection fault, probably for ..." (and
# Oops); a user process's prints "traps: NAME[PID] general protection fault ip:...", which is
# the crash of a test's tool, failed by its own check, not the kernel's trouble.
KERNEL_TROUBLE='BUG:|WARNING:|Oops|general protection fault,|kernel BUG|refcount_t|unreferenced object|KASAN|UBSAN|lockdep|possible recursive|circular locking|list_(add|del) corruption|Call Trace'
