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
 * metaroce_dv_qp_rings() and metaroce_dv_qp_doorbell() (version METAROCE_1.1) return the first
 * two of those errors and, for the doorbell, the kernel's.
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

/*
 * The work queues of a QP as mapped in this process, for tests and for applications that write
 * their work requests into the rings themselves (as mlx5dv_init_obj() hands out mlx5's work
 * queue buffers and doorbell records).
 *
 * A ring is num_entries entries (a power of two) of entry_size bytes from buf on, and two
 * free-running 32-bit indices: slot = index & (num_entries - 1), and the ring holds
 * producer - consumer entries (wrapping arithmetic). The application is the producer: it writes
 * the entry at its producer index, then stores producer + 1 with release ordering
 * (__atomic_store_n(p, v, __ATOMIC_RELEASE)). The kernel is the consumer and publishes its
 * consumer index after it has copied an entry out; the slot is free from then on (read it with
 * acquire ordering). Entries are struct metaroce_dv_send_wqe (SQ) and struct
 * metaroce_dv_recv_wqe (RQ) below. An entry_size larger than the structure (a QP created with
 * more than METAROCE_DV_MAX_SEND_SGE send or METAROCE_DV_MAX_RECV_SGE receive SGEs) makes
 * room for a longer SGE list: it goes on past the structure's sge array, 16 bytes an SGE, up
 * to the end of the entry (at most METAROCE_DV_MAX_SGE SGEs).
 *
 * The kernel validates everything: it copies each entry out before looking at it, never reads
 * its own index back from the mapping (rewriting consumer changes nothing in the kernel), and
 * treats a producer index more than num_entries ahead of its consumer index (or behind it),
 * or an entry ibv_post_send()/ibv_post_recv() could not have written (an unknown opcode or send
 * flag, a non-zero reserved field, more SGEs or inline bytes than the entry holds), as fatal
 * for the QP: it moves to IBV_QPS_ERR, IBV_EVENT_QP_FATAL is raised (ibv_get_async_event),
 * the work requests in the rings complete with IBV_WC_WR_FLUSH_ERR (those of a ring whose
 * producer index is out of range once it is back in range, at the next doorbell), and the
 * device's hardware counter ring_errors counts it. Work requests that decode but are invalid
 * (a bad lkey, an SGE list longer than the QP's max_send_sge) complete in error as if posted.
 *
 * ibv_post_send()/ibv_post_recv() keep their own copy of the producer index: do not post to a
 * queue through the verbs after writing its producer index directly (or do it only from the
 * same thread, having put the index back where the verbs left it).
 */
struct metaroce_dv_ring {
	void *buf;		/* the entry of slot 0; slot i is at buf + i * entry_size */
	uint32_t entry_size;	/* bytes from one entry to the next */
	uint32_t num_entries;	/* a power of two */
	uint32_t *producer;	/* the producer index: the application's */
	uint32_t *consumer;	/* the consumer index: the kernel's (never read by the kernel) */
};

struct metaroce_dv_qp_rings {
	uint32_t comp_mask;	/* in: optional fields wanted; out: those filled. None is
				 * defined yet: set 0, it reads back 0 */
	uint32_t reserved;	/* out: 0 */
	struct metaroce_dv_ring sq;
	struct metaroce_dv_ring rq;	/* all zero when the QP receives through an SRQ */
};

/*
 * Fills *rings with the QP's send and receive rings. The addresses stay valid until the QP is
 * destroyed. On failure *rings is left unchanged.
 */
int metaroce_dv_qp_rings(struct ibv_qp *qp, struct metaroce_dv_qp_rings *rings);

/*
 * The SQ doorbell: the kernel looks at the QP's rings (the SQ in IBV_QPS_RTS, the RQ from
 * IBV_QPS_RTR on; in IBV_QPS_ERR it flushes them). What ibv_post_send() does after it wrote its
 * entries; the RQ needs none in normal operation (the kernel looks when a message arrives).
 */
int metaroce_dv_qp_doorbell(struct ibv_qp *qp);

/* The layouts of the ring entries (the kernel ABI's struct metaroce_send_wqe and
 * metaroce_recv_wqe, little-endian). */
#define METAROCE_DV_SEND_WQE_SIZE 256
#define METAROCE_DV_MAX_SEND_SGE 12
#define METAROCE_DV_MAX_INLINE 192
#define METAROCE_DV_RECV_WQE_SIZE 128
#define METAROCE_DV_MAX_RECV_SGE 7
#define METAROCE_DV_MAX_SGE 32		/* in an entry of the largest size */

struct metaroce_dv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct metaroce_dv_send_wqe {
	uint64_t wr_id;
	uint32_t opcode;	/* enum ibv_wr_opcode: SEND(_WITH_IMM), RDMA_WRITE(_WITH_IMM),
				 * RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD */
	uint32_t send_flags;	/* IBV_SEND_FENCE, _SIGNALED, _SOLICITED, _INLINE, _IP_CSUM */
	uint32_t num_sge;	/* entries of data.sge; 0 with IBV_SEND_INLINE */
	uint32_t inline_len;	/* bytes of data.inline_data with IBV_SEND_INLINE; else 0 */
	uint32_t imm_data;	/* big-endian, as in struct ibv_send_wr */
	uint32_t reserved0;	/* 0 */
	uint64_t remote_addr;	/* RDMA and atomic operations */
	uint32_t rkey;
	uint32_t reserved1;	/* 0 */
	uint64_t compare_add;	/* atomics */
	uint64_t swap;
	union {
		struct metaroce_dv_sge sge[METAROCE_DV_MAX_SEND_SGE];
		uint8_t inline_data[METAROCE_DV_MAX_INLINE];
	} data;
};

struct metaroce_dv_recv_wqe {
	uint64_t wr_id;
	uint32_t num_sge;	/* entries of sge */
	uint32_t reserved;	/* 0 */
	struct metaroce_dv_sge sge[METAROCE_DV_MAX_RECV_SGE];
};

#ifdef __cplusplus
}
#endif

#endif /* METAROCE_DV_H */
