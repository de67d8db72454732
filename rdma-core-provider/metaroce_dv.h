/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Direct verbs of the metaroce libibverbs provider: what the standard verbs cannot express about
 * a MetaRoCE QP, i.e. the connection it rides (planes, paths and their congestion state) and
 * the planes it may use.
 *
 * Installed as <infiniband/metaroce_dv.h>; link with -lmetaroce (libmetaroce.so.1, which is
 * also the libibverbs plugin: libibverbs/libmetaroce-rdmav34.so is a symlink to it, as rdma-core
 * does for mlx5). The functions are versioned METAROCE_1.0.
 *
 * The functions returning int return 0 or a positive errno value (like mlx5dv_*):
 *   EINVAL      a NULL argument, or paths == NULL with num_path_entries > 0
 *   EOPNOTSUPP  the QP is not one of a metaroce device (another provider's, or none), or the
 *               kernel module does not answer the metaroce part of the command (too old)
 *   EPROTO      the kernel's answer is malformed
 *   ENOMEM      no memory for the command's response buffer
 *   other       the kernel's error for the command (a modify_qp changing no standard
 *               attribute, carrying the metaroce request: IB_USER_VERBS_EX_CMD_MODIFY_QP)
 * They may be called from any thread, concurrently with the data path of the same QP.
 */
#ifndef METAROCE_DV_H
#define METAROCE_DV_H

#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * true if device is bound to the metaroce provider (an entry of ibv_get_device_list() whose
 * driver is this library), false otherwise and for NULL.
 */
bool metaroce_dv_is_supported(struct ibv_device *device);

/* The most paths a connection has: an array of this many entries always holds them all. */
#define METAROCE_DV_MAX_PATHS 256

/* A path's state (the same values as the kernel ABI's enum metaroce_path_state). */
enum metaroce_dv_path_state {
	METAROCE_DV_PATH_ACTIVE = 0,	/* carries data */
	METAROCE_DV_PATH_SUSPECT = 1,	/* timed out: only probes until one is answered */
	METAROCE_DV_PATH_FAILED = 2,	/* timed out repeatedly: probed in the background */
	METAROCE_DV_PATH_PROBING = 3,	/* a failed path that answered: carries data on probation */
};

/* One path of a QP's connection, as the kernel sees it at the time of the query. */
struct metaroce_dv_path {
	uint16_t path_id;
	uint8_t plane;		/* the plane (netdev) the path leaves on */
	uint8_t state;		/* enum metaroce_dv_path_state */
	uint16_t udp_sport;	/* the path's UDP source port now (its ECMP entropy) */
	uint16_t reserved0;
	uint32_t srtt_us;	/* smoothed RTT in microseconds; 0 before the first sample */
	uint32_t cwnd;		/* congestion window, packets */
	uint32_t in_flight;	/* packets sent and not yet acknowledged or declared lost */
	uint32_t reserved1;
	uint64_t packets_sent;	/* data and probes, retransmissions included */
	uint64_t retransmits;
	uint64_t ecn_marks;	/* CE marks the peer echoed */
	uint64_t timeouts;
};

/*
 * Input and output of metaroce_dv_query_qp(). The connection is the one all QPs between the
 * same two metaroce devices share; its counters cover all of them.
 */
struct metaroce_dv_qp_info {
	uint32_t plane_mask;	/* out: the QP's plane restriction, bit k = plane k; 0 = every plane */
	uint32_t connected;	/* out: 1 once the QP rides a connection (RTR and later); else 0,
				 * and so is everything below but num_path_entries */
	uint32_t planes;	/* out: planes the connection spreads over */
	uint32_t planes_up;	/* out: bit per plane that carries packets to the peer now */
	uint32_t num_paths;	/* out: paths the connection sends on */
	uint32_t qps;		/* out: QPs open on the connection */
	uint32_t num_path_entries; /* in: capacity of paths[]; out: entries filled, path order,
				    * min(capacity, num_paths) */
	uint32_t comp_mask;	/* in: optional fields wanted; out: those filled. None is
				 * defined yet: set 0, it reads back 0 */
	struct metaroce_dv_path *paths; /* in: the caller's array, NULL if capacity is 0 */
};

/*
 * Reads the QP's plane restriction and its connection's state into *info: the fixed fields,
 * and the first min(info->num_path_entries, num_paths) paths into info->paths. A path count
 * larger than the capacity given is not an error (compare num_paths with num_path_entries).
 * On failure *info and paths[] are left unchanged.
 */
int metaroce_dv_query_qp(struct ibv_qp *qp, struct metaroce_dv_qp_info *info);

/*
 * Restricts the QP's packets to the planes in plane_mask (bit k: plane k); 0 lifts the
 * restriction (every plane). It applies to the packets sent from then on;
 * metaroce_dv_query_qp() reads it back (plane_mask). It steers, it never fails the QP: while
 * none of the planes named can carry packets (down, not reachable, or all their paths
 * failed), the QP's packets take the other planes. Callable in any QP state; set before RTR,
 * it applies from the first packet.
 */
int metaroce_dv_set_qp_planes(struct ibv_qp *qp, uint32_t plane_mask);

#ifdef __cplusplus
}
#endif

#endif /* METAROCE_DV_H */
