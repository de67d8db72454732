/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause) */
/*
 * The ABI between the metaroce kernel module (drivers/) and its libibverbs provider
 * (rdma-core-provider/). Every structure here is exchanged through uverbs udata: fixed widths,
 * little-endian host order, explicit padding, no pointers. Grow structures only at the end.
 */
#ifndef METAROCE_ABI_USER_H
#define METAROCE_ABI_USER_H

#include <linux/types.h>

/* ib_device_ops.uverbs_abi_ver; the provider accepts exactly this version. */
#define METAROCE_UVERBS_ABI_VERSION 1

/*
 * ib_device_ops.driver_id. A private value outside the kernel's enum rdma_driver_id (which ends
 * well below 64) and not RDMA_DRIVER_UNKNOWN, so libibverbs binds only our provider.
 */
#define METAROCE_DRIVER_ID 0x4d52

/* Our UDP destination port (RoCEv2 is 4791; we stay off it so rxe can run beside us). */
#define METAROCE_UDP_PORT 4793

/* Response to alloc_ucontext (ibv_open_device). */
struct metaroce_alloc_ucontext_resp {
	__u32 abi_version;	/* METAROCE_UVERBS_ABI_VERSION */
	__u32 wire_version;	/* MetaRoCE wire format version spoken by the device */
	__u32 max_paths;	/* logical paths per connection the device supports */
	__u32 max_planes;	/* netdevs (planes) one device may span */
	__u64 reserved[2];
};

/*
 * Shared-memory rings (SQ, RQ, SRQ, CQ), mapped by the provider with mmap() at the offset
 * and length the create response gives. Layout of one mapping:
 *
 *   offset 0:    struct metaroce_ring_hdr (128 bytes)
 *   offset 128:  num_entries entries of entry_size bytes (num_entries a power of two)
 *
 * Indices are free-running __u32 counters; slot = index & (num_entries - 1). Only the producer
 * writes `producer`, only the consumer writes `consumer`. The producer writes the entry, then
 * (release) the index; the consumer reads the index (acquire), then the entry.
 *   SQ, RQ, SRQ: userspace produces, the kernel consumes. The kernel copies each entry out of
 *                the ring before it validates or uses it, and never trusts `producer` beyond
 *                `consumer + num_entries`.
 *   CQ:          the kernel produces, userspace consumes.
 * The kernel keeps its own index (`consumer` of an SQ/RQ/SRQ, `producer` of a CQ) privately and
 * only publishes it here; it never reads it back, so rewriting it changes nothing in the kernel.
 * A `producer` that claims more than the ring holds (or lies behind `consumer`), or an SQ/RQ
 * entry the provider could not have written (an unknown opcode or send flag, a non-zero reserved
 * field, more than METAROCE_MAX_SGE SGEs (the device's max_send_sge, max_sge_rd,
 * max_recv_sge and max_srq_sge) or more inline bytes than the entry holds) is fatal: the QP
 * moves to the error state, its work requests flush and
 * IB_EVENT_QP_FATAL is raised (an SRQ: IB_EVENT_SRQ_ERR, and it gives no more entries). An entry
 * the provider could have written but the device cannot carry out (an SGE naming no key the
 * device gave, lengths that overflow a message, more SGEs than the QP (or its SRQ) was created
 * with) completes in error instead.
 * The hardware counter ring_errors counts these.
 * The SQ doorbell is the uverbs POST_SEND command with no work requests (ibv_post_send on a
 * metaroce QP makes it); RQ/SRQ need none (the kernel looks when a message arrives).
 */
#define METAROCE_RING_HDR_SIZE 128

struct metaroce_ring_hdr {
	__u32 producer;
	__u32 pad0[15];
	__u32 consumer;
	__u32 pad1[15];
};

struct metaroce_sge {
	__aligned_u64 addr;
	__u32 length;
	__u32 lkey;
};

/*
 * Entry sizes. A ring's entry_size (struct metaroce_mmap_info) may be larger than its WQE
 * structure: then the SGE array (data.sge of a send WQE, sge of a receive WQE) goes on past
 * the structure to the end of the entry, 16 bytes an SGE. The kernel sizes a QP's SQ entries
 * for its max_send_sge and its RQ's (an SRQ's) for max_recv_sge (max_sge): entry_size is
 * the structure's size, or METAROCE_SEND_WQE_SIZE - METAROCE_SEND_WQE_DATA + 16 * max_send_sge
 * (METAROCE_RECV_WQE_SIZE - 16 * METAROCE_MAX_RECV_SGE + 16 * max_recv_sge) if that is
 * larger. No WQE carries more than METAROCE_MAX_SGE SGEs.
 */
#define METAROCE_MAX_SGE 32

#define METAROCE_SEND_WQE_SIZE 256
#define METAROCE_SEND_WQE_DATA 192
#define METAROCE_MAX_SEND_SGE (METAROCE_SEND_WQE_DATA / 16)	/* 12: in the structure */
#define METAROCE_MAX_INLINE METAROCE_SEND_WQE_DATA		/* 192 bytes */

/* A send work request as posted (opcode and flags are the ibv_wr_opcode/ibv_send_flags values). */
struct metaroce_send_wqe {
	__aligned_u64 wr_id;
	__u32 opcode;
	__u32 send_flags;
	__u32 num_sge;		/* SGEs in data.sge, or 0 with IBV_SEND_INLINE */
	__u32 inline_len;	/* bytes in data.inline_data with IBV_SEND_INLINE */
	__u32 imm_data;		/* big-endian, as in struct ibv_send_wr */
	__u32 reserved0;
	__aligned_u64 remote_addr;	/* RDMA and atomic operations */
	__u32 rkey;
	__u32 reserved1;
	__aligned_u64 compare_add;	/* atomics */
	__aligned_u64 swap;
	union {
		struct metaroce_sge sge[METAROCE_MAX_SEND_SGE];
		__u8 inline_data[METAROCE_MAX_INLINE];
	} data;
};

/*
 * Memory windows (RC QPs). IBV_WR_BIND_MW (also what ibv_bind_mw posts for a type 1 window):
 * rkey is the window's rkey now, imm_data its new rkey (host order; only the low byte may
 * differ), remote_addr the window's address, compare_add its length (0: unbind, type 1 only),
 * swap the rights (IBV_ACCESS_*) in its high half and the MR's lkey in its low half.
 * IBV_WR_LOCAL_INV: imm_data is the rkey to invalidate (host order: invalidate_rkey). Neither
 * carries data: num_sge and inline_len are 0. The device carries them out once every WQE
 * posted before has completed; they complete with IBV_WC_BIND_MW / IBV_WC_LOCAL_INV, or with
 * IBV_WC_MW_BIND_ERR / IBV_WC_LOC_QP_OP_ERR, and the QP goes to the error state.
 */

/*
 * IBV_WR_ATOMIC_WRITE (RC, built by ibv_wr_atomic_write): remote_addr (8-byte aligned) and
 * rkey, compare_add the 8 bytes to store read as a big-endian number (they travel and land in
 * order); the target needs IBV_ACCESS_REMOTE_WRITE. IBV_WR_FLUSH (RC, ibv_wr_flush):
 * remote_addr, rkey, compare_add the length, swap the placement type (IBV_FLUSH_GLOBAL or
 * _PERSISTENT) in bits 0-7 and the level (IBV_FLUSH_RANGE or _MR) in bits 8-15; the target
 * region needs IBV_ACCESS_FLUSH_GLOBAL (the device has no persistent memory: a persistent
 * flush completes with IBV_WC_REM_ACCESS_ERR). Neither carries data (num_sge and inline_len
 * are 0); both run at the responder after every earlier WQE's data is placed, and complete
 * with IBV_WC_ATOMIC_WRITE / IBV_WC_FLUSH.
 */

/*
 * UD QPs. A send WQE of a UD QP names its destination in its 32 bytes from remote_addr on,
 * which are then read as struct metaroce_ud_av (remote_addr, rkey, reserved1, compare_add and
 * swap mean nothing on UD): the address handle's destination GID (RoCE v2: an IPv4-mapped or
 * an IPv6 address) and the work request's remote QPN and Q_Key (bit 31 set: the QP's own
 * Q_Key, as the verbs say). Address handles live in the provider alone; the kernel takes the
 * GID from each WQE and sends from the QP's port. Opcodes: SEND and SEND_WITH_IMM, a message
 * at most the port's active MTU (larger: the WQE completes with IBV_WC_LOC_LEN_ERR). A receive
 * on a UD QP gets 40 bytes of GRH first (from an IPv4 sender: 20 zero bytes, then its IPv4
 * header; from IPv6: its IPv6 header), then the payload; the CQE has IBV_WC_GRH, src_qp and
 * byte_len = 40 + the payload's length.
 */
#define METAROCE_UD_AV_OFFSET 32

struct metaroce_ud_av {
	__u8 dgid[16];
	__u32 remote_qpn;
	__u32 remote_qkey;
	__u32 reserved[2];	/* 0 */
};

#define METAROCE_RECV_WQE_SIZE 128
#define METAROCE_MAX_RECV_SGE 7	/* in the structure */

/* A receive work request (RQ and SRQ). */
struct metaroce_recv_wqe {
	__aligned_u64 wr_id;
	__u32 num_sge;
	__u32 reserved;
	struct metaroce_sge sge[METAROCE_MAX_RECV_SGE];
};

#define METAROCE_CQE_SIZE 64

/* A completion (status, opcode and wc_flags are the ibv_wc_status/ibv_wc_opcode/ibv_wc_flags values). */
struct metaroce_cqe {
	__aligned_u64 wr_id;
	__u32 status;
	__u32 opcode;
	__u32 vendor_err;
	__u32 byte_len;
	__u32 imm_data;		/* big-endian, as in struct ibv_wc */
	__u32 qp_num;
	__u32 src_qp;
	__u32 wc_flags;
	__u16 pkey_index;
	__u16 slid;
	__u8 sl;
	__u8 dlid_path_bits;
	__u8 reserved[18];
};

/* Where a ring is mapped: pass offset to mmap() on the uverbs fd, map length bytes. */
struct metaroce_mmap_info {
	__aligned_u64 offset;
	__aligned_u64 length;
	__u32 num_entries;
	__u32 entry_size;
};

/* Also the response of resize_cq: the new ring, to map in place of the old one. */
struct metaroce_create_cq_resp {
	struct metaroce_mmap_info ring;
};

/*
 * ibv_modify_srq with IBV_SRQ_MAX_WR moves the SRQ to a new ring. The uverbs modify_srq has no
 * response: the command's driver data names where the kernel writes the new ring's struct
 * metaroce_mmap_info (as rxe's does). The WQEs posted and not taken yet move to the new ring, in
 * order, from its slot 0; its producer index (set by the kernel) says where posting goes on.
 * While the call runs the provider posts nothing to the SRQ.
 */
struct metaroce_modify_srq_cmd {
	__aligned_u64 mmap_info_addr;
};

struct metaroce_create_srq_resp {
	struct metaroce_mmap_info ring;
	__u32 srq_num;
	__u32 reserved;
};

struct metaroce_create_qp_resp {
	struct metaroce_mmap_info sq;
	struct metaroce_mmap_info rq;	/* length 0 when the QP uses an SRQ */
	__u32 max_inline_data;
	__u32 reserved;
};

/*
 * Direct verbs (metaroce_dv_*, rdma-core-provider/metaroce_dv.h). The provider reads and sets a
 * QP's MetaRoCE state through the driver data of the extended modify_qp command
 * (IB_USER_VERBS_EX_CMD_MODIFY_QP, ibv_cmd_modify_qp_ex), as mlx5 carries its own modify_qp
 * options and response; attr_mask may be 0 (no standard attribute changes). A stock
 * ibv_modify_qp carries neither, and the kernel then does neither.
 */
enum metaroce_modify_qp_comp_mask {
	METAROCE_MODIFY_QP_PLANES = 1 << 0,	/* set plane_mask */
};

struct metaroce_modify_qp_cmd {
	__u32 comp_mask;	/* METAROCE_MODIFY_QP_*; an unknown bit: EOPNOTSUPP */
	__u32 plane_mask;	/* bit k: plane k may carry this QP's packets; 0: every plane */
	__aligned_u64 reserved;	/* 0, else EINVAL */
};

/* A path's state (the transport's PathState). */
enum metaroce_path_state {
	METAROCE_PATH_ACTIVE = 0,	/* carries data */
	METAROCE_PATH_SUSPECT = 1,	/* timed out: only probes until one is answered */
	METAROCE_PATH_FAILED = 2,	/* timed out repeatedly: probed in the background */
	METAROCE_PATH_PROBING = 3,	/* a failed path that answered: carries data on probation */
};

/* One path of a QP's connection. */
struct metaroce_path_info {
	__u16 path_id;
	__u8 plane;
	__u8 state;		/* enum metaroce_path_state */
	__u16 udp_sport;	/* the path's UDP source port now (its ECMP entropy) */
	__u16 reserved;
	__u32 srtt_us;		/* smoothed RTT; 0 before the first sample */
	__u32 cwnd;		/* window, packets */
	__u32 in_flight;	/* packets sent and not yet acknowledged or declared lost */
	__u32 reserved1;
	__aligned_u64 packets_sent;	/* data and probes, retransmissions included */
	__aligned_u64 retransmits;
	__aligned_u64 ecn_marks;	/* CE marks the peer echoed */
	__aligned_u64 timeouts;
};

/*
 * The driver response of that modify_qp, written when the caller's buffer has room for the
 * fixed part: the QP's restriction, and its connection's planes and paths (the connection all
 * QPs between the same two devices share). paths[] holds as many entries as the buffer has
 * room for, in path order, at most num_paths.
 */
struct metaroce_modify_qp_resp {
	__u32 response_length;	/* bytes written, paths[] included */
	__u32 plane_mask;	/* this QP's restriction now (0: every plane) */
	__u32 connected;	/* 1 once the QP rides a connection (RTR and later); else 0, and so is the rest */
	__u32 planes;		/* planes the connection spreads over */
	__u32 planes_up;	/* bit per plane that carries packets to the peer now */
	__u32 num_paths;	/* paths the connection sends on */
	__u32 qps;		/* QPs (streams) open on the connection */
	__u32 num_path_info;	/* entries in paths[] */
	struct metaroce_path_info paths[];
};

#endif /* METAROCE_ABI_USER_H */
