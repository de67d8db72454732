#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Boot several guests (each its own kernel and metaroce device) on a virtual multi-plane fabric
# and run a command on them; exit with the worst exit status.
#
#   qemu-ci/run-cluster.sh [options] [--] COMMAND
#
#   --guests N       guests g1..gN (default 3; 2 to 4)
#   --planes P       fabric planes (default 2; 1 to 4)
#   --all            run COMMAND on every guest (default: on g1 only; the others serve, their
#                    devices and sshd up, until it ends)
#   --timeout S      power everything off after S seconds, exit 124 (default 1800)
#   --memory MB      memory per guest (default 1536)      --cpus N   vCPUs per guest (default 1)
#   --payload DIR    as run-vm.sh (default $REPO/build/guest)
#   --out DIR        results: DIR/gI is guest gI's /mnt/ci/out (default a temporary directory)
#
# The fabric: a control network (10.99.0.I/24, for the launcher and ssh) and P planes (plane p:
# 10.(100+p).0.I/24), each one Ethernet segment made of a UDP multicast group on the host's
# loopback (run-vm.sh --nic), chosen at random per run so that runs never hear each other. The
# guests reach nothing else. In each guest selftests/cluster/node.sh names the NICs ctl and
# p1..pP, brings up sshd with a key made for this run, and adds mroce0 over the planes (one port
# per plane) before COMMAND runs; see it for what COMMAND finds (/etc/hosts, cluster.env).
# Every guest's console comes out prefixed with its name; all are powered off at the end, on a
# timeout or on Ctrl-C. Exit status: the worst of the guests' (run-vm.sh's meaning).
source "$(dirname "$0")/common.sh"

usage() { sed -n '3,/^source/{/^source/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }

GUESTS=3 PLANES=2 ALL=0 TIMEOUT=1800 MEMORY=1536 CPUS=1 PAYLOAD="" OUT=""
while [ $# -gt 0 ]; do
	case "$1" in
	--guests) GUESTS="$2"; shift 2 ;;
	--planes) PLANES="$2"; shift 2 ;;
	--all) ALL=1; shift ;;
	--timeout) TIMEOUT="$2"; shift 2 ;;
	--memory) MEMORY="$2"; shift 2 ;;
	--cpus) CPUS="$2"; shift 2 ;;
	--payload) PAYLOAD="$2"; shift 2 ;;
	--out) OUT="$2"; shift 2 ;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) log "unknown option $1"; usage ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || { log "give the command as one argument (a bash script)"; usage; }
[[ "$GUESTS" =~ ^[2-4]$ ]] || die "--guests wants 2 to 4 (this machine runs them all at once)"
[[ "$PLANES" =~ ^[1-4]$ ]] || die "--planes wants 1 to 4"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds"
if [ -z "$PAYLOAD" ] && [ -d "$REPO_DIR/build/guest" ]; then PAYLOAD="$REPO_DIR/build/guest"; fi
[ -n "$PAYLOAD" ] && [ -f "$PAYLOAD/selftests/cluster/node.sh" ] ||
	die "the payload (--payload, default build/guest) has no selftests/cluster/node.sh: make payload"

# Built once here, not by every guest's run-vm.sh at the same time.
KDIR="${KDIR:-$("$QEMU_CI_DIR/build-kernel.sh")}"
export KDIR
"$QEMU_CI_DIR/build-image.sh" >/dev/null

TMP=$(mktemp -d "${TMPDIR:-/tmp}/metaroce-cluster.XXXXXX")
SHARED="$TMP/cluster"
mkdir -p "$SHARED"
if [ -n "$OUT" ]; then mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); else OUT="$TMP/out"; fi
PIDS=()
cleanup() {
	local pid
	# run-vm.sh powers its guest off (kills QEMU) when it is signalled.
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

# A random administratively scoped group per run: one port for the control network, one per
# plane.
group="239.$((RANDOM % 200 + 20)).$((RANDOM % 256)).$((RANDOM % 254 + 1))"
port0=$((20000 + RANDOM % 20000))
cat >"$SHARED/cluster.env" <<EOF
CLUSTER_GUESTS=$GUESTS
CLUSTER_PLANES=$PLANES
CLUSTER_ALL=$ALL
EOF
printf '%s\n' "$1" >"$SHARED/cmd.sh"

log "cluster: $GUESTS guests, $PLANES planes, fabric $group ports $port0..$((port0 + PLANES))"
for i in $(seq 1 "$GUESTS"); do
	nics=()
	for n in $(seq 0 "$PLANES"); do
		# 52:54:00 is QEMU's prefix; then the network (0 control, p plane p) and the guest.
		nics+=(--nic "$group:$((port0 + n)),52:54:00:4d:$(printf %02x%s "$n" ":$(printf %02x "$i")")")
	done
	mkdir -p "$OUT/g$i"
	"$QEMU_CI_DIR/run-vm.sh" --name "g$i" --timeout "$TIMEOUT" --memory "$MEMORY" --cpus "$CPUS" \
		--payload "$PAYLOAD" --out "$OUT/g$i" --cluster-dir "$SHARED" --env "CLUSTER_INDEX=$i" \
		"${nics[@]}" -- "bash /opt/metaroce/selftests/cluster/node.sh" \
		> >(sed -u "s/^/g$i| /") 2>&1 &
	PIDS+=($!)
done

# A guest that ends early (a failure, a crash) must not leave the others waiting for it.
declare -A running
for i in "${!PIDS[@]}"; do running[${PIDS[$i]}]=g$((i + 1)); done
worst=0
while [ "${#running[@]}" -gt 0 ]; do
	rc=0 pid=""
	wait -n -p pid "${!running[@]}" || rc=$?
	[ -n "$pid" ] || break
	log "cluster: ${running[$pid]} exited with status $rc"
	unset "running[$pid]"
	if [ "$rc" != 0 ]; then
		[ "$rc" -le "$worst" ] || worst=$rc
		touch "$SHARED/abort"
	fi
done
PIDS=()
log "cluster: worst exit status $worst; results in $OUT"
[ "$OUT" != "$TMP/out" ] || log "cluster: (a temporary directory, now removed: give --out to keep it)"
exit "$worst"
