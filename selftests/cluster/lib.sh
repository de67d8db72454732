# SPDX-License-Identifier: GPL-2.0
# Helpers for commands that run on g1 of a cluster (qemu-ci/run-cluster.sh). Source it after
# ../lib.sh.

# shellcheck disable=SC1091
. /mnt/cluster/cluster.env
CLUSTER_N=$CLUSTER_GUESTS
CLUSTER_P=$CLUSTER_PLANES
CLUSTER_HOSTS=$(seq -s, -f 'g%g' 1 "$CLUSTER_N")
COLLECTIVES=/opt/metaroce/selftests/cluster/collectives.py

# remote HOST CMD: CMD on HOST (its control address) through ssh.
remote() { ssh -o BatchMode=yes -o ConnectTimeout=20 "$1" "$2"; }

# listening HOST PORT: HOST has a TCP listener on PORT (perftest's and the pingpongs'
# out-of-band exchange) or an rdma_cm listener on it (rping).
listening() {
	remote "$1" "ss -Hltn 'sport = :$2' | grep -q . ||
		rdma resource show cm_id | grep -q 'state LISTEN .*:$2\b'"
}

# ipv4_gid DEV PORT: the GID index of the port's IPv4 GID (::ffff:a.b.c.d).
ipv4_gid() {
	local f
	for f in $(ls /sys/class/infiniband/"$1"/ports/"$2"/gids/ | sort -n); do
		if grep -q '^0000:0000:0000:0000:0000:ffff:' /sys/class/infiniband/"$1"/ports/"$2"/gids/"$f"; then
			echo "$f"
			return 0
		fi
	done
	return 1
}

# on_all CMD: CMD on every guest (g1 here), all must succeed.
on_all() {
	local j rc=0
	for j in $(seq 1 "$CLUSTER_N"); do
		if [ "$j" = 1 ]; then bash -c "$1" || rc=$?; else remote g$j "$1" || rc=$?; fi
	done
	return $rc
}

# add_rxe: an rxe device rxe0 over plane 1 on every guest, for comparisons.
add_rxe() {
	on_all "$RDMA link show rxe0/1 >/dev/null 2>&1 || $RDMA link add rxe0 type rxe netdev p1"
}

# The MPI job launcher over each transport, one rank per guest (mpirun reaches the guests
# through ssh on the control network):
#   metaroce  Open MPI's pml ucx, UCX rc_verbs (data) and ud_verbs (wire-up) on mroce0 port 1
#             (the device sprays a connection over every plane whatever its port)
#   rxe       the same on rxe0 (plane 1), with UCX_UD_ETH_DGID_CHECK=n: UCX's UD reads a RoCE
#             datagram's GRH area as an IPv6 header unless the completion's sl says IPv4 (2,
#             mlx5's convention, which metaroce follows: ib::ud_recv_sl); rxe's says 0, so UCX
#             drops every IPv4 datagram as one for another GID and its wire-up times out
#   ofi       Open MPI's pml cm with mtl ofi: libfabric's verbs;ofi_rxm (RC QPs through rdma_cm)
#             on mroce0, with libfabric's MR cache off: no memory monitor here (neither the
#             one Open MPI exports, memhooks nor uffd: the kernel has no userfaultfd) sees the
#             buffers freed and mapped again, so a cached registration reads pages the buffer
#             no longer has (1 MiB Allreduces came out wrong with it, on rxe as on metaroce)
#   tcp       pml ob1, btl tcp over plane 1
MPI_UCX=(-x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_WARN_UNUSED_ENV_VARS=n)
MPI_OFI=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include 'verbs;ofi_rxm'
	-x FI_MR_CACHE_MAX_COUNT=0)
mpi_opts() { # transport: its mpirun options
	case "$1" in
	metaroce) echo "--mca pml ucx ${MPI_UCX[*]} -x UCX_NET_DEVICES=mroce0:1" ;;
	rxe) echo "--mca pml ucx ${MPI_UCX[*]} -x UCX_NET_DEVICES=rxe0:1 -x UCX_UD_ETH_DGID_CHECK=n" ;;
	ofi) echo "${MPI_OFI[*]} -x FI_VERBS_DEVICE_NAME=mroce0" ;;
	tcp) echo "--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include p1" ;;
	*) return 1 ;;
	esac
}

# mpi TRANSPORT CMD...: CMD as an MPI job, one rank on each guest.
mpi() {
	local t=$1 opts
	shift
	opts=$(mpi_opts "$t") || { echo "unknown transport $t" >&2; return 2; }
	# shellcheck disable=SC2086 # opts is a list of options
	mpirun --allow-run-as-root -H "$CLUSTER_HOSTS" -np "$CLUSTER_N" --bind-to none $opts "$@"
}

# plane_down P / plane_up P: plane P's link taken down (brought back) in every guest.
plane_down() { on_all "ip link set p$1 down"; }
plane_up() { on_all "ip link set p$1 up"; }

# poweroff_guest J: guest gJ loses its power now (cluster/node.sh; its run still counts as a
# success).
poweroff_guest() { touch /mnt/cluster/poweroff.g"$1"; }
