// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Host check of the built plugin without an RDMA device. It dlopen()s the plugin the way
 * libibverbs does, inspects what the constructor registered through the C view of driver.h
 * (which cross-checks the Rust structure layouts), then drives the provider's callbacks against
 * the real rdma-core libibverbs talking to a fake uverbs "kernel":
 *
 * - verbs_register_driver_34 and write() are defined here and exported (-rdynamic). The
 *   executable comes first in the global lookup scope, so the plugin's
 *   verbs_register_driver_34@IBVERBS_PRIVATE_34 and libibverbs' write() bind here.
 * - The "uverbs fd" is /dev/null: its ioctl() fails with ENOTTY, so libibverbs falls back to the
 *   legacy write() ABI, which fake_uverbs_write() answers like the kernel would (the response
 *   pointer is the first payload word): GET_CONTEXT, QUERY_DEVICE, QUERY_PORT and the data-path
 *   commands (PD, MR, CQ, QP, SRQ, and POST_SEND with no WRs, the SQ doorbell).
 * - mmap() is defined here too: a mapping of the fake uverbs fd maps the same offset of a
 *   memfd that the fake kernel also maps, so provider and "kernel" share the rings like with
 *   the real module. On a doorbell the fake consumes the SQ and completes signaled WQEs into
 *   the send CQ; the checks then poll them back through ibv_poll_cq.
 * - Address handles (made in the provider: only the first asks the port count, with a
 *   QUERY_DEVICE) and UD QPs, whose WQEs, by ibv_post_send and by ibv_wr_*, must carry
 *   struct metaroce_ud_av at METAROCE_UD_AV_OFFSET.
 * - The extended verbs through verbs.h's inline entry points: ibv_create_cq_ex (refusing what
 *   the CQE does not carry) and ibv_start_poll/ibv_next_poll/ibv_end_poll with the
 *   ibv_wc_read_* functions, ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS and the
 *   ibv_wr_* API: the fake sees the WQEs only at ibv_wr_complete, with one doorbell, and none
 *   after ibv_wr_abort or a failed batch.
 * - The direct verbs (metaroce_dv.h), looked up with dlvsym(..., "METAROCE_1.0"/"1.1"): the
 *   fake answers their extended modify_qp (IB_USER_VERBS_EX_CMD_MODIFY_QP with our driver
 *   command and response) after the checks the kernel's ib_uverbs_write() makes, and like the
 *   module fills as many path entries as the response has room for; metaroce_dv_qp_rings()
 *   must give the fake's ring memory, and a WQE written there directly completes after
 *   metaroce_dv_qp_doorbell().
 *
 * Usage: load-check PLUGIN [LIBRARY]
 *   PLUGIN   the name libibverbs dlopens (libmetaroce-rdmav34.so, a symlink to the library)
 *   LIBRARY  the library itself (libmetaroce.so.1): opening it too must give the same handle
 *            and no second registration (one file, one constructor run)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <infiniband/driver.h>

#include "metaroce-abi.h"
#include "metaroce_dv.h"

static const struct verbs_device_ops *registered;
static int registrations;

void verbs_register_driver(const struct verbs_device_ops *ops)
{
	registered = ops;
	registrations++;
}

/*
 * verbs_set_ops() is interposed too, to see the context ops the provider sets through the C
 * view of driver.h; it calls libibverbs' own. libibverbs sets its dummy ops first
 * (verbs_init_context), the provider its own last.
 */
_Static_assert(IBVERBS_PABI_VERSION == 34, "the plugin's private ABI");
static const struct verbs_context_ops *provider_ops;

void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops)
{
	static void (*real)(struct verbs_context *, const struct verbs_context_ops *);

	if (!real)
		real = (__typeof__(real))dlvsym(RTLD_NEXT, "verbs_set_ops", "IBVERBS_PRIVATE_34");
	if (!real)
		abort();
	provider_ops = ops;
	real(vctx, ops);
}

/*
 * What verbs_open_device() adds after alloc_context (set_lib_ops(), static in libibverbs):
 * ibv_create_cq_ex's entry point, which calls the provider's op and then verbs_init_cq().
 * open_fake() calls alloc_context itself, so it installs this.
 */
static struct ibv_cq_ex *lib_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_cq_ex *cq;

	if (attr->wc_flags & ~(uint64_t)IBV_CREATE_CQ_SUP_WC_FLAGS) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	cq = provider_ops->create_cq_ex(ctx, attr);
	if (cq)
		verbs_init_cq(ibv_cq_ex_to_cq(cq), ctx, attr->channel, attr->cq_context);
	return cq;
}

/* ---- fake kernel ---- */

static int fake_fd = -1;		/* the cmd_fd handed to alloc_context */
static int fake_async_fd = -1;		/* the async fd GET_CONTEXT "creates" */
static __u32 fake_abi_version;		/* what alloc_ucontext reports */
static int fake_calls[64];
static int fake_ncalls;	/* every command the fake saw, extended ones too */

/* Shared memory of the fake device: a memfd, mapped here as the "kernel" view. */
#define FAKE_MEM_SIZE (1u << 20)
static int fake_memfd = -1;
static unsigned char *fake_mem;
static size_t fake_mem_used;
static int fake_mmaps;
/* Where the rings' indices start: just below the u32 wrap, so the checks cross it. */
#define FAKE_RING_START 0xfffffffeu

struct fake_ring {
	size_t off;
	__u32 n, esz;
};

static struct fake_ring fake_cqs[8], fake_srqs[8];
static struct {
	struct fake_ring sq, rq;
	__u32 send_cq, recv_cq;
} fake_qps[8];
static unsigned int fake_ncq, fake_nqp, fake_nsrq, fake_npd, fake_nmr;
static __u32 fake_cq_entries_override;	/* a bad num_entries for the next CQ, if set */
static __u64 fake_last_hca_va;
static struct ib_uverbs_rereg_mr fake_last_rereg;
static int fake_doorbells;
static struct metaroce_send_wqe fake_wqes[16];	/* WQEs the fake kernel consumed */
static unsigned int fake_nwqes;

/* The direct verbs' modify_qp: the QPs' plane masks, the connection, the last call. */
static __u32 fake_plane_mask[8];
static int fake_dv_connected;
#define FAKE_DV_PATHS 3
static enum {
	FAKE_DV_OK,
	FAKE_DV_SILENT,		/* a module without the direct verbs: no driver response */
	FAKE_DV_OVERFULL,	/* claims one path entry more than the room */
	FAKE_DV_BUSY,		/* fails the command with EBUSY */
} fake_dv_mode;
static struct {
	int calls;
	size_t core_in, drv_in, core_out, drv_out;	/* bytes */
	__u32 qp_handle, attr_mask;
	struct metaroce_modify_qp_cmd cmd;
} fake_dv;

static struct metaroce_mmap_info fake_ring_alloc(struct fake_ring *r, __u32 n, __u32 esz)
{
	size_t len = (METAROCE_RING_HDR_SIZE + (size_t)n * esz + 4095) & ~(size_t)4095;
	struct metaroce_mmap_info mi = {
		.offset = fake_mem_used, .length = len, .num_entries = n, .entry_size = esz,
	};
	struct metaroce_ring_hdr *h;

	if (fake_mem_used + len > FAKE_MEM_SIZE)
		abort();
	r->off = fake_mem_used;
	r->n = n;
	r->esz = esz;
	memset(fake_mem + r->off, 0, len);
	h = (void *)(fake_mem + r->off);
	h->producer = h->consumer = FAKE_RING_START;
	fake_mem_used += len;
	return mi;
}

static struct metaroce_ring_hdr *ring_hdr(const struct fake_ring *r)
{
	return (void *)(fake_mem + r->off);
}

static void *ring_entry(const struct fake_ring *r, __u32 index)
{
	return fake_mem + r->off + METAROCE_RING_HDR_SIZE + (size_t)(index & (r->n - 1)) * r->esz;
}

/* The kernel side of a CQ: write the CQE, then publish it (release). */
static void fake_complete(__u32 cq, const struct metaroce_cqe *cqe)
{
	const struct fake_ring *r = &fake_cqs[cq];
	struct metaroce_ring_hdr *h = ring_hdr(r);
	__u32 p = h->producer;

	if (p - __atomic_load_n(&h->consumer, __ATOMIC_ACQUIRE) >= r->n)
		abort(); /* the checks never overflow the CQ */
	memcpy(ring_entry(r, p), cqe, sizeof(*cqe));
	__atomic_store_n(&h->producer, p + 1, __ATOMIC_RELEASE);
}

static __u32 wc_opcode(__u32 wr_opcode)
{
	switch (wr_opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	default:
		return IBV_WC_SEND;
	}
}

/* The doorbell: consume every published SQ WQE (copying it out first, as the kernel does). */
static void fake_consume_sq(__u32 qp)
{
	const struct fake_ring *r = &fake_qps[qp].sq;
	struct metaroce_ring_hdr *h = ring_hdr(r);
	__u32 prod = __atomic_load_n(&h->producer, __ATOMIC_ACQUIRE);
	__u32 cons = h->consumer;

	for (; cons != prod; cons++) {
		struct metaroce_send_wqe w;
		struct metaroce_cqe cqe = { 0 };
		__u32 i;

		memcpy(&w, ring_entry(r, cons), sizeof(w));
		if (fake_nwqes < 16)
			fake_wqes[fake_nwqes++] = w;
		if (!(w.send_flags & IBV_SEND_SIGNALED))
			continue;
		cqe.wr_id = w.wr_id;
		cqe.status = IBV_WC_SUCCESS;
		cqe.opcode = wc_opcode(w.opcode);
		cqe.qp_num = 0x100 + qp;
		cqe.byte_len = w.inline_len;
		for (i = 0; i < w.num_sge && i < METAROCE_MAX_SEND_SGE; i++)
			cqe.byte_len += w.data.sge[i].length;
		fake_complete(fake_qps[qp].send_cq, &cqe);
	}
	__atomic_store_n(&h->consumer, cons, __ATOMIC_RELEASE);
}

static void fill(const struct ib_uverbs_cmd_hdr *hdr, const void *resp, size_t len)
{
	__u64 response;

	memcpy(&response, hdr + 1, sizeof(response));
	if (len > hdr->out_words * 4u)
		len = hdr->out_words * 4u;
	memcpy((void *)(uintptr_t)response, resp, len);
}

/*
 * A core response followed by our driver part: the driver part ends the response buffer, the
 * core part starts it (libibverbs may use an older, shorter core layout when it does not know
 * the uverbs ABI, e.g. CREATE_QP_V3 here; those are prefixes of the current one).
 */
static int fill_drv(const struct ib_uverbs_cmd_hdr *hdr, const void *core, size_t core_len,
		    const void *drv, size_t drv_len)
{
	size_t out = hdr->out_words * 4u;
	__u64 response;

	if (out < drv_len) {
		errno = ENOSPC;
		return -1;
	}
	memcpy(&response, hdr + 1, sizeof(response));
	memcpy((void *)(uintptr_t)response, core, core_len < out - drv_len ? core_len : out - drv_len);
	memcpy((char *)(uintptr_t)response + out - drv_len, drv, drv_len);
	return 0;
}

/*
 * IB_USER_VERBS_EX_CMD_MODIFY_QP: the checks of the kernel's ib_uverbs_write() for _ex
 * commands, then what the module's modify_qp does with our driver data: the command is
 * optional (a shorter one reads as zeros), unknown comp_mask bits are refused, and the
 * response is written when the driver buffer has room for its fixed part, with as many paths
 * as fit.
 */
static ssize_t fake_ex_modify_qp(const void *buf, size_t count)
{
	const struct ex_hdr *h = buf;
	const struct ib_uverbs_ex_modify_qp *core = (const void *)(h + 1);
	struct ib_uverbs_ex_modify_qp_resp core_resp = { .response_length = sizeof(core_resp) };
	unsigned char drv_resp[sizeof(struct metaroce_modify_qp_resp) +
			       FAKE_DV_PATHS * sizeof(struct metaroce_path_info)]
		__attribute__((aligned(8)));
	struct metaroce_modify_qp_resp *r = (void *)drv_resp;
	struct metaroce_path_info *paths = (void *)(r + 1);
	size_t core_in, drv_in, core_out, drv_out, room, n, i;
	struct metaroce_modify_qp_cmd cmd = { 0 };
	char *response;

	if (count < sizeof(*h)) {
		errno = EINVAL;
		return -1;
	}
	core_in = h->hdr.in_words * 8u;
	drv_in = h->ex_hdr.provider_in_words * 8u;
	core_out = h->hdr.out_words * 8u;
	drv_out = h->ex_hdr.provider_out_words * 8u;
	if (core_in + drv_in != count - sizeof(*h) || h->ex_hdr.cmd_hdr_reserved ||
	    !h->ex_hdr.response) {
		errno = EINVAL;
		return -1;
	}
	if (core_in < sizeof(*core) || core_out < sizeof(core_resp)) {
		errno = ENOSPC;
		return -1;
	}
	fake_dv.calls++;
	fake_dv.core_in = core_in;
	fake_dv.drv_in = drv_in;
	fake_dv.core_out = core_out;
	fake_dv.drv_out = drv_out;
	fake_dv.qp_handle = core->base.qp_handle;
	fake_dv.attr_mask = core->base.attr_mask;
	memcpy(&cmd, (const char *)core + core_in, drv_in < sizeof(cmd) ? drv_in : sizeof(cmd));
	fake_dv.cmd = cmd;
	if (core->base.qp_handle >= fake_nqp || core->base.attr_mask) {
		errno = EINVAL;
		return -1;
	}
	if (cmd.comp_mask & ~METAROCE_MODIFY_QP_PLANES) {
		errno = EOPNOTSUPP;
		return -1;
	}
	if (cmd.reserved) {
		errno = EINVAL;
		return -1;
	}
	if (fake_dv_mode == FAKE_DV_BUSY) {
		errno = EBUSY;
		return -1;
	}
	if (cmd.comp_mask & METAROCE_MODIFY_QP_PLANES)
		fake_plane_mask[core->base.qp_handle] = cmd.plane_mask;

	response = (char *)(uintptr_t)h->ex_hdr.response;
	memcpy(response, &core_resp, sizeof(core_resp));
	if (fake_dv_mode == FAKE_DV_SILENT || drv_out < sizeof(*r))
		return count;
	room = (drv_out - sizeof(*r)) / sizeof(*paths);
	memset(drv_resp, 0, sizeof(drv_resp));
	r->plane_mask = fake_plane_mask[core->base.qp_handle];
	n = 0;
	if (fake_dv_connected) {
		r->connected = 1;
		r->planes = 2;
		r->planes_up = 0x3;
		r->num_paths = FAKE_DV_PATHS;
		r->qps = 1;
		n = room < FAKE_DV_PATHS ? room : FAKE_DV_PATHS;
		for (i = 0; i < n; i++)
			paths[i] = (struct metaroce_path_info){
				.path_id = i, .plane = i % 2, .state = i == 2 ? METAROCE_PATH_SUSPECT : 0,
				.udp_sport = 49152 + i, .reserved = 0xffff, .srtt_us = 100 + i,
				.cwnd = 10 + i, .in_flight = i, .packets_sent = 1000 + i,
				.retransmits = 20 + i, .ecn_marks = 30 + i, .timeouts = 40 + i,
			};
	}
	r->num_path_info = n;
	r->response_length = sizeof(*r) + n * sizeof(*paths);
	if (fake_dv_mode == FAKE_DV_OVERFULL)
		r->num_path_info = room + 1;
	memcpy(response + core_out, drv_resp, sizeof(*r) + n * sizeof(*paths));
	return count;
}

static ssize_t fake_uverbs_write(const void *buf, size_t count)
{
	const struct ib_uverbs_cmd_hdr *hdr = buf;

	fake_ncalls++;
	if (count < sizeof(*hdr) + 4) { /* the smallest command: DEALLOC_PD, DEREG_MR */
		errno = EINVAL;
		return -1;
	}
	if (hdr->command == (IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_EX_CMD_MODIFY_QP))
		return fake_ex_modify_qp(buf, count);
	if (hdr->command & IB_USER_VERBS_CMD_FLAG_EXTENDED) {
		errno = ENOSYS; /* makes libibverbs use the legacy commands */
		return -1;
	}
	if (hdr->in_words * 4u != count) {
		errno = EINVAL;
		return -1;
	}
	if (hdr->command < 64)
		fake_calls[hdr->command]++;

	switch (hdr->command) {
	case IB_USER_VERBS_CMD_GET_CONTEXT: {
		struct {
			struct ib_uverbs_get_context_resp core;
			struct metaroce_alloc_ucontext_resp drv;
		} resp = {
			.core = { .num_comp_vectors = 1 },
			.drv = { .abi_version = fake_abi_version, .wire_version = 1,
				 .max_paths = 4, .max_planes = 2 },
		};
		fake_async_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		resp.core.async_fd = fake_async_fd;
		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_QUERY_DEVICE: {
		struct ib_uverbs_query_device_resp resp = {
			.fw_ver = 1ull << 32 | 2 << 16 | 3,
			.vendor_id = 0x1234,
			.vendor_part_id = 0x4d52,
			.max_qp = 1024,
			.max_qp_rd_atom = 16,
			.phys_port_cnt = 1,
		};
		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_QUERY_PORT: {
		const struct ib_uverbs_query_port *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_query_port_resp resp = {
			.state = IBV_PORT_ACTIVE,
			.max_mtu = IBV_MTU_4096,
			.active_mtu = IBV_MTU_1024,
			.gid_tbl_len = 16,
			.link_layer = IBV_LINK_LAYER_ETHERNET,
		};
		if (cmd->port_num != 1) {
			errno = EINVAL;
			return -1;
		}
		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_ALLOC_PD: {
		struct ib_uverbs_alloc_pd_resp resp = { .pd_handle = fake_npd++ };

		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_REG_MR: {
		const struct ib_uverbs_reg_mr *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_reg_mr_resp resp = {
			.mr_handle = fake_nmr, .lkey = 0x1000 + fake_nmr, .rkey = 0x2000 + fake_nmr,
		};

		fake_nmr++;
		fake_last_hca_va = cmd->hca_va;
		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_REREG_MR: {
		/* As the module: the keys stay; flags, PD and new address recorded. */
		const struct ib_uverbs_rereg_mr *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_rereg_mr_resp resp = {
			.lkey = 0x1000 + (uint32_t)cmd->mr_handle,
			.rkey = 0x2000 + (uint32_t)cmd->mr_handle,
		};

		fake_last_rereg = *cmd;
		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_ALLOC_MW: {
		struct ib_uverbs_alloc_mw_resp resp = { .mw_handle = 1, .rkey = 0x80000100 };

		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_DEALLOC_MW:
	case IB_USER_VERBS_CMD_DEALLOC_PD:
	case IB_USER_VERBS_CMD_DEREG_MR:
	case IB_USER_VERBS_CMD_REQ_NOTIFY_CQ:
	case IB_USER_VERBS_CMD_MODIFY_QP:
		return count;
	case IB_USER_VERBS_CMD_MODIFY_SRQ: {
		/* As the module: a resize makes a ring of the next power of two at or above max_wr,
		 * moves the WQEs posted and not taken into it in order (EINVAL if they do not fit)
		 * and writes its description where the command's driver part says. */
		const struct ib_uverbs_modify_srq *cmd = (const void *)(hdr + 1);
		const struct metaroce_modify_srq_cmd *drv = (const void *)(cmd + 1);
		struct fake_ring old;
		struct metaroce_ring_hdr *oh, *nh;
		struct metaroce_mmap_info mi;
		__u32 n = 1, c, pending, i;

		if (!(cmd->attr_mask & IBV_SRQ_MAX_WR))
			return count;
		if (count < sizeof(*hdr) + sizeof(*cmd) + sizeof(*drv) || !drv->mmap_info_addr ||
		    cmd->srq_handle >= fake_nsrq) {
			errno = EINVAL;
			return -1;
		}
		old = fake_srqs[cmd->srq_handle];
		oh = ring_hdr(&old);
		c = oh->consumer;
		pending = oh->producer - c;
		while (n < cmd->max_wr)
			n <<= 1;
		if (pending > n) {
			errno = EINVAL;
			return -1;
		}
		mi = fake_ring_alloc(&fake_srqs[cmd->srq_handle], n, sizeof(struct metaroce_recv_wqe));
		nh = ring_hdr(&fake_srqs[cmd->srq_handle]);
		for (i = 0; i < pending; i++)
			memcpy(ring_entry(&fake_srqs[cmd->srq_handle], nh->producer + i),
			       ring_entry(&old, c + i), sizeof(struct metaroce_recv_wqe));
		nh->producer += pending;
		memcpy((void *)(uintptr_t)drv->mmap_info_addr, &mi, sizeof(mi));
		return count;
	}
	case IB_USER_VERBS_CMD_CREATE_CQ: {
		const struct ib_uverbs_create_cq *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_create_cq_resp core = { .cq_handle = fake_ncq, .cqe = cmd->cqe };
		struct metaroce_create_cq_resp drv;

		if (fake_ncq == 8) {
			errno = ENOMEM;
			return -1;
		}
		drv.ring = fake_ring_alloc(&fake_cqs[fake_ncq], 16, sizeof(struct metaroce_cqe));
		if (fake_cq_entries_override)
			drv.ring.num_entries = fake_cq_entries_override;
		fake_ncq++;
		return fill_drv(hdr, &core, sizeof(core), &drv, sizeof(drv)) ? -1 : (ssize_t)count;
	}
	case IB_USER_VERBS_CMD_RESIZE_CQ: {
		/* As the module: a new ring of the next power of two above cqe, the completions
		 * not polled yet moved into it in order (EINVAL if they do not fit). */
		const struct ib_uverbs_resize_cq *cmd = (const void *)(hdr + 1);
		struct fake_ring old = fake_cqs[cmd->cq_handle];
		struct metaroce_ring_hdr *oh = ring_hdr(&old), *nh;
		struct ib_uverbs_resize_cq_resp core = { 0 };
		struct metaroce_create_cq_resp drv;
		__u32 n = 1, c = oh->consumer, pending = oh->producer - c, i;

		while (n < cmd->cqe + 1)
			n <<= 1;
		if (cmd->cq_handle >= fake_ncq || pending > n) {
			errno = EINVAL;
			return -1;
		}
		drv.ring = fake_ring_alloc(&fake_cqs[cmd->cq_handle], n, sizeof(struct metaroce_cqe));
		nh = ring_hdr(&fake_cqs[cmd->cq_handle]);
		for (i = 0; i < pending; i++)
			memcpy(ring_entry(&fake_cqs[cmd->cq_handle], nh->producer + i),
			       ring_entry(&old, c + i), sizeof(struct metaroce_cqe));
		nh->producer += pending;
		core.cqe = n - 1;
		return fill_drv(hdr, &core, sizeof(core), &drv, sizeof(drv)) ? -1 : (ssize_t)count;
	}
	case IB_USER_VERBS_CMD_DESTROY_CQ:
	case IB_USER_VERBS_CMD_DESTROY_QP:
	case IB_USER_VERBS_CMD_DESTROY_SRQ: {
		struct ib_uverbs_destroy_cq_resp resp = { 0 };

		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_CREATE_QP: {
		const struct ib_uverbs_create_qp *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_create_qp_resp core = {
			.qp_handle = fake_nqp, .qpn = 0x100 + fake_nqp,
			.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 2,
			.max_inline_data = 128,
		};
		struct metaroce_create_qp_resp drv = { .max_inline_data = 128 };

		if (fake_nqp == 8 || cmd->send_cq_handle >= fake_ncq || cmd->recv_cq_handle >= fake_ncq) {
			errno = EINVAL;
			return -1;
		}
		drv.sq = fake_ring_alloc(&fake_qps[fake_nqp].sq, 4, sizeof(struct metaroce_send_wqe));
		if (!cmd->is_srq)
			drv.rq = fake_ring_alloc(&fake_qps[fake_nqp].rq, 4, sizeof(struct metaroce_recv_wqe));
		fake_qps[fake_nqp].send_cq = cmd->send_cq_handle;
		fake_qps[fake_nqp].recv_cq = cmd->recv_cq_handle;
		fake_nqp++;
		return fill_drv(hdr, &core, sizeof(core), &drv, sizeof(drv)) ? -1 : (ssize_t)count;
	}
	case IB_USER_VERBS_CMD_QUERY_QP: {
		struct ib_uverbs_query_qp_resp resp = {
			.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 2,
			.qp_state = IBV_QPS_INIT,
		};

		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_POST_SEND: {
		const struct ib_uverbs_post_send *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_post_send_resp resp = { 0 };

		/* What the kernel's ib_uverbs_post_send() needs for a WR-less call. */
		if (count != sizeof(*hdr) + sizeof(*cmd) || hdr->out_words * 4u < sizeof(resp) ||
		    cmd->wr_count || cmd->sge_count ||
		    cmd->wqe_size < sizeof(struct ib_uverbs_send_wr) || cmd->qp_handle >= fake_nqp) {
			errno = EINVAL;
			return -1;
		}
		fake_doorbells++;
		fake_consume_sq(cmd->qp_handle);
		fill(hdr, &resp, sizeof(resp));
		return count;
	}
	case IB_USER_VERBS_CMD_CREATE_SRQ: {
		const struct ib_uverbs_create_srq *cmd = (const void *)(hdr + 1);
		struct ib_uverbs_create_srq_resp core = {
			.srq_handle = fake_nsrq, .max_wr = 4, .max_sge = 1, .srqn = 0x200 + fake_nsrq,
		};
		struct metaroce_create_srq_resp drv = { .srq_num = 0x200 + fake_nsrq };

		if (fake_nsrq == 8 || cmd->max_sge > 1) {
			errno = EINVAL;
			return -1;
		}
		drv.ring = fake_ring_alloc(&fake_srqs[fake_nsrq], 4, sizeof(struct metaroce_recv_wqe));
		fake_nsrq++;
		return fill_drv(hdr, &core, sizeof(core), &drv, sizeof(drv)) ? -1 : (ssize_t)count;
	}
	default:
		errno = EOPNOTSUPP;
		return -1;
	}
}

ssize_t write(int fd, const void *buf, size_t count)
{
	if (fd >= 0 && fd == fake_fd)
		return fake_uverbs_write(buf, count);
	return syscall(SYS_write, fd, buf, count);
}

/* Maps of the fake uverbs fd map the fake device memory (the memfd) at the same offset. */
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (fd >= 0 && fd == fake_fd) {
		fake_mmaps++;
		if (off < 0 || (size_t)off + len > FAKE_MEM_SIZE || !(flags & MAP_SHARED)) {
			errno = EINVAL;
			return MAP_FAILED;
		}
		fd = fake_memfd;
	}
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

/* ---- checks ---- */

static int failures;
#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "load-check: FAILED: %s (line %d)\n",  \
				#cond, __LINE__);                              \
			failures++;                                            \
		}                                                              \
	} while (0)

static int fd_is_open(int fd)
{
	return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

static struct verbs_context *open_fake(struct verbs_device *vdev, __u32 abi_version)
{
	struct verbs_context *vctx;

	fake_abi_version = abi_version;
	fake_async_fd = -1;
	fake_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	errno = 0;
	provider_ops = NULL;
	vctx = registered->alloc_context(&vdev->device, fake_fd, NULL);
	if (vctx && provider_ops && provider_ops->create_cq_ex)
		vctx->create_cq_ex = lib_create_cq_ex;
	return vctx;
}

/* The context ops the provider set: what it implements, and nothing else. */
static void check_context_ops(const struct verbs_context_ops *ops)
{
	CHECK(ops->query_device_ex && ops->query_port && ops->free_context);
	CHECK(ops->alloc_pd && ops->dealloc_pd && ops->reg_mr && ops->rereg_mr && ops->dereg_mr);
	CHECK(ops->create_cq && ops->poll_cq && ops->req_notify_cq && ops->destroy_cq);
	CHECK(ops->create_cq_ex && ops->create_qp_ex);
	CHECK(ops->create_qp && ops->query_qp && ops->modify_qp && ops->destroy_qp);
	CHECK(ops->post_send && ops->post_recv);
	CHECK(ops->create_srq && ops->modify_srq && ops->query_srq && ops->destroy_srq);
	CHECK(ops->post_srq_recv);
	CHECK(ops->create_ah && ops->destroy_ah);
	CHECK(ops->resize_cq && !ops->cq_event);
	CHECK(ops->alloc_mw && ops->bind_mw && ops->dealloc_mw);
	CHECK(!ops->alloc_parent_domain && !ops->open_xrcd && !ops->create_srq_ex);
	CHECK(!ops->create_wq && !ops->create_flow && !ops->alloc_td);
}

/* The direct verbs, from the plugin by dlvsym(), typed by the header's prototypes. */
static __typeof__(metaroce_dv_is_supported) *dv_is_supported;
static __typeof__(metaroce_dv_query_qp) *dv_query_qp;
static __typeof__(metaroce_dv_set_qp_planes) *dv_set_qp_planes;
static __typeof__(metaroce_dv_qp_rings) *dv_qp_rings;
static __typeof__(metaroce_dv_qp_doorbell) *dv_qp_doorbell;

static int resolve_dv(void *handle)
{
	static const struct {
		const char *name, *version;
	} syms[] = {
		{ "metaroce_dv_is_supported", "METAROCE_1.0" },
		{ "metaroce_dv_query_qp", "METAROCE_1.0" },
		{ "metaroce_dv_set_qp_planes", "METAROCE_1.0" },
		{ "metaroce_dv_qp_rings", "METAROCE_1.1" },
		{ "metaroce_dv_qp_doorbell", "METAROCE_1.1" },
	};
	void *fns[5];
	int i;

	for (i = 0; i < 5; i++) {
		fns[i] = dlvsym(handle, syms[i].name, syms[i].version);
		if (!fns[i]) {
			fprintf(stderr, "load-check: FAILED: no %s@%s\n", syms[i].name,
				syms[i].version);
			return -1;
		}
		/* The default version: what an application linking -lmetaroce binds. */
		CHECK(dlsym(handle, syms[i].name) == fns[i]);
	}
	dv_is_supported = (__typeof__(dv_is_supported))fns[0];
	dv_query_qp = (__typeof__(dv_query_qp))fns[1];
	dv_set_qp_planes = (__typeof__(dv_set_qp_planes))fns[2];
	dv_qp_rings = (__typeof__(dv_qp_rings))fns[3];
	dv_qp_doorbell = (__typeof__(dv_qp_doorbell))fns[4];
	return 0;
}

/* The direct verbs on qp (handle 0, in INIT) through the fake's _ex modify_qp. */
static void check_dv(struct ibv_qp *qp)
{
	static const struct verbs_device_ops other_ops = { .name = "other" };
	struct verbs_device other_dev = { .ops = &other_ops };
	struct ibv_context other_ctx = { .device = &other_dev.device };
	struct ibv_qp other_qp = { .context = &other_ctx }, orphan_qp = { 0 };
	struct metaroce_dv_path paths[METAROCE_DV_MAX_PATHS + 1];
	struct metaroce_dv_qp_info info;
	const size_t fixed = sizeof(struct metaroce_modify_qp_resp);
	const size_t entry = sizeof(struct metaroce_path_info);
	int calls;

	CHECK(dv_is_supported(qp->context->device));
	CHECK(!dv_is_supported(&other_dev.device));
	CHECK(!dv_is_supported(NULL));

	/* Not connected: the fixed part only; the command as the kernel expects it. */
	memset(paths, 0xa5, sizeof(paths));
	info = (struct metaroce_dv_qp_info){ .num_path_entries = 0, .connected = 7 };
	CHECK(dv_query_qp(qp, &info) == 0);
	CHECK(info.connected == 0 && info.num_paths == 0 && info.num_path_entries == 0);
	CHECK(info.plane_mask == 0 && info.comp_mask == 0 && info.paths == NULL);
	CHECK(fake_dv.calls == 1 && fake_dv.qp_handle == 0 && fake_dv.attr_mask == 0);
	CHECK(fake_dv.core_in == sizeof(struct ib_uverbs_ex_modify_qp));
	CHECK(fake_dv.drv_in == sizeof(struct metaroce_modify_qp_cmd));
	CHECK(fake_dv.core_out == sizeof(struct ib_uverbs_ex_modify_qp_resp));
	CHECK(fake_dv.drv_out == fixed);
	CHECK(fake_dv.cmd.comp_mask == 0 && fake_dv.cmd.reserved == 0);

	/* Connected with 3 paths, room for 2: the first 2, the third entry untouched. */
	fake_dv_connected = 1;
	info = (struct metaroce_dv_qp_info){ .num_path_entries = 2, .paths = paths };
	CHECK(dv_query_qp(qp, &info) == 0);
	CHECK(fake_dv.drv_out == fixed + 2 * entry);
	CHECK(info.connected == 1 && info.planes == 2 && info.planes_up == 0x3 && info.qps == 1);
	CHECK(info.num_paths == FAKE_DV_PATHS && info.num_path_entries == 2 && info.paths == paths);
	CHECK(paths[0].path_id == 0 && paths[1].path_id == 1 && paths[1].plane == 1);
	CHECK(paths[1].udp_sport == 49153 && paths[1].srtt_us == 101 && paths[1].cwnd == 11);
	CHECK(paths[1].in_flight == 1 && paths[1].packets_sent == 1001);
	CHECK(paths[1].retransmits == 21 && paths[1].ecn_marks == 31 && paths[1].timeouts == 41);
	CHECK(paths[1].state == METAROCE_DV_PATH_ACTIVE && paths[1].reserved0 == 0);
	CHECK(paths[2].path_id == 0xa5a5);

	/* Room for more than there can be: the buffer is capped at METAROCE_DV_MAX_PATHS. */
	info = (struct metaroce_dv_qp_info){ .num_path_entries = METAROCE_DV_MAX_PATHS + 1,
					     .paths = paths };
	CHECK(dv_query_qp(qp, &info) == 0);
	CHECK(fake_dv.drv_out == fixed + METAROCE_DV_MAX_PATHS * entry);
	CHECK(info.num_path_entries == FAKE_DV_PATHS);
	CHECK(paths[2].state == METAROCE_DV_PATH_SUSPECT && paths[2].timeouts == 42);
	CHECK(paths[3].path_id == 0xa5a5);

	/* Setting the planes, read back; the command carries the mask and nothing else. */
	CHECK(dv_set_qp_planes(qp, 0x2) == 0);
	CHECK(fake_dv.cmd.comp_mask == METAROCE_MODIFY_QP_PLANES && fake_dv.cmd.plane_mask == 0x2);
	CHECK(fake_dv.attr_mask == 0 && fake_dv.drv_out == fixed);
	info = (struct metaroce_dv_qp_info){ 0 };
	CHECK(dv_query_qp(qp, &info) == 0 && info.plane_mask == 0x2);
	CHECK(dv_set_qp_planes(qp, 0) == 0);
	CHECK(dv_query_qp(qp, &info) == 0 && info.plane_mask == 0);

	/* Refused before any command. */
	calls = fake_dv.calls;
	info = (struct metaroce_dv_qp_info){ .num_path_entries = 1, .paths = NULL, .qps = 77 };
	CHECK(dv_query_qp(qp, &info) == EINVAL);
	CHECK(dv_query_qp(NULL, &info) == EINVAL);
	CHECK(dv_query_qp(qp, NULL) == EINVAL);
	CHECK(dv_set_qp_planes(NULL, 1) == EINVAL);
	info.num_path_entries = 0;
	CHECK(dv_query_qp(&other_qp, &info) == EOPNOTSUPP);
	CHECK(dv_query_qp(&orphan_qp, &info) == EOPNOTSUPP);
	CHECK(dv_set_qp_planes(&other_qp, 1) == EOPNOTSUPP);
	CHECK(dv_set_qp_planes(&orphan_qp, 1) == EOPNOTSUPP);
	CHECK(fake_dv.calls == calls);

	/* A module without the direct verbs, a malformed answer, a failing command. */
	fake_dv_mode = FAKE_DV_SILENT;
	CHECK(dv_query_qp(qp, &info) == EOPNOTSUPP);
	CHECK(dv_set_qp_planes(qp, 1) == EOPNOTSUPP);
	fake_dv_mode = FAKE_DV_OVERFULL;
	info.num_path_entries = 2;
	info.paths = paths;
	CHECK(dv_query_qp(qp, &info) == EPROTO);
	fake_dv_mode = FAKE_DV_BUSY;
	CHECK(dv_query_qp(qp, &info) == EBUSY);
	CHECK(dv_set_qp_planes(qp, 1) == EBUSY);
	/* Failures leave *info alone. */
	CHECK(info.qps == 77 && info.num_path_entries == 2);
	fake_dv_mode = FAKE_DV_OK;
	fake_dv_connected = 0;
	fake_plane_mask[0] = 0;
}

static __u32 kernel_producer(const struct fake_ring *r)
{
	return __atomic_load_n(&ring_hdr(r)->producer, __ATOMIC_ACQUIRE);
}

static __u32 kernel_consumer(const struct fake_ring *r)
{
	return __atomic_load_n(&ring_hdr(r)->consumer, __ATOMIC_ACQUIRE);
}

/*
 * metaroce_dv_qp_rings() and metaroce_dv_qp_doorbell() on qp (QP 0, whose SQ and RQ are the
 * fake's rings; no WQE outstanding): the addresses are the fake kernel's ring memory, and a
 * WQE an application writes there itself is consumed at the doorbell and completes on cq.
 * Posting to qp's SQ through the verbs is not allowed after this (metaroce_dv.h).
 */
static void check_dv_rings(struct ibv_qp *qp, struct ibv_cq *cq)
{
	static const struct verbs_device_ops other_ops = { .name = "other" };
	struct verbs_device other_dev = { .ops = &other_ops };
	struct ibv_context other_ctx = { .device = &other_dev.device };
	struct ibv_qp other_qp = { .context = &other_ctx };
	const struct fake_ring *sq = &fake_qps[0].sq, *rq = &fake_qps[0].rq;
	struct metaroce_dv_qp_rings rings, untouched;
	struct metaroce_dv_send_wqe w;
	int doorbells = fake_doorbells;
	struct ibv_wc wc;
	__u32 p;

	memset(&rings, 0xa5, sizeof(rings));
	rings.comp_mask = 0;
	CHECK(dv_qp_rings(qp, &rings) == 0);
	CHECK(rings.comp_mask == 0 && rings.reserved == 0);
	CHECK(rings.sq.num_entries == sq->n && rings.sq.entry_size == sizeof(struct metaroce_send_wqe));
	CHECK(rings.rq.num_entries == rq->n && rings.rq.entry_size == sizeof(struct metaroce_recv_wqe));
	CHECK(sizeof(struct metaroce_dv_send_wqe) == METAROCE_DV_SEND_WQE_SIZE);
	CHECK(sizeof(struct metaroce_dv_recv_wqe) == METAROCE_DV_RECV_WQE_SIZE);
	/* Another mapping of the same memory: what one side stores, the other reads. */
	CHECK(*rings.sq.producer == kernel_producer(sq) && *rings.sq.consumer == kernel_consumer(sq));
	CHECK(*rings.rq.producer == kernel_producer(rq) && *rings.rq.consumer == kernel_consumer(rq));

	p = *rings.sq.producer;
	memset(&w, 0, sizeof(w));
	w.wr_id = 9;
	w.opcode = IBV_WR_SEND;
	w.send_flags = IBV_SEND_SIGNALED;
	w.num_sge = 1;
	w.data.sge[0] = (struct metaroce_dv_sge){ .addr = 0x1234, .length = 16, .lkey = 0x1000 };
	memcpy((char *)rings.sq.buf + (size_t)(p & (rings.sq.num_entries - 1)) * rings.sq.entry_size,
	       &w, sizeof(w));
	__atomic_store_n(rings.sq.producer, p + 1, __ATOMIC_RELEASE);
	CHECK(kernel_producer(sq) == p + 1);
	CHECK(dv_qp_doorbell(qp) == 0);
	CHECK(fake_doorbells == doorbells + 1);
	CHECK(__atomic_load_n(rings.sq.consumer, __ATOMIC_ACQUIRE) == p + 1);
	CHECK(fake_nwqes >= 1 && fake_wqes[fake_nwqes - 1].wr_id == 9);
	CHECK(ibv_poll_cq(cq, 1, &wc) == 1);
	CHECK(wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 16);

	/* Refused, the struct left alone, no command. */
	untouched = rings;
	CHECK(dv_qp_rings(NULL, &rings) == EINVAL && dv_qp_rings(qp, NULL) == EINVAL);
	CHECK(dv_qp_rings(&other_qp, &rings) == EOPNOTSUPP);
	CHECK(memcmp(&rings, &untouched, sizeof(rings)) == 0);
	CHECK(dv_qp_doorbell(NULL) == EINVAL && dv_qp_doorbell(&other_qp) == EOPNOTSUPP);
	CHECK(fake_doorbells == doorbells + 1);
}

/*
 * The extended verbs through libibverbs' own entry points (the inline ibv_start_poll, ibv_wr_*
 * of verbs.h): ibv_create_cq_ex and ibv_create_qp_ex make a CQ and a QP with the plain
 * commands and rings; WQEs built with ibv_wr_* reach the fake's SQ only at ibv_wr_complete,
 * with one doorbell; completions are read one at a time and freed at ibv_end_poll.
 */
static void check_ex(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_mr *mr, char *buf)
{
	struct ibv_cq_init_attr_ex cia = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_qp_init_attr_ex qia = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
	};
	struct ibv_sge sge[3] = {
		{ .addr = (uintptr_t)buf, .length = 100, .lkey = mr->lkey },
		{ .addr = (uintptr_t)buf + 100, .length = 28, .lkey = mr->lkey },
		{ .addr = (uintptr_t)buf + 128, .length = 8, .lkey = mr->lkey },
	};
	struct ibv_poll_cq_attr pattr = { 0 };
	struct ibv_qp_attr qattr = { .qp_state = IBV_QPS_INIT };
	struct ibv_qp_init_attr qinit;
	struct metaroce_cqe cqe = { 0 };
	unsigned int ncq = fake_ncq, nqp = fake_nqp, nw, db, i, calls;
	struct ibv_ah_attr aa = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid.raw = { 0xfe, 0x80, [8] = 2, [15] = 7 } },
	};
	struct ibv_ah *ah;
	const struct fake_ring *sq, *kcq;
	struct ibv_cq_ex *cq;
	struct ibv_qp_ex *qpx;
	struct ibv_qp *qp;
	struct ibv_wc wc;
	__u32 p;

	/* Refused before any command: what the CQE does not carry, overrun, parent domains. */
	cia.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cia) == NULL && errno == EOPNOTSUPP);
	cia.wc_flags = IBV_WC_STANDARD_FLAGS;
	cia.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	cia.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cia) == NULL && errno == EOPNOTSUPP);
	cia.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cia) == NULL && errno == EOPNOTSUPP);
	CHECK(fake_ncq == ncq);
	cia.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	cia.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	cq = ibv_create_cq_ex(ctx, &cia);
	CHECK(cq != NULL);
	if (!cq)
		return;
	kcq = &fake_cqs[ncq];
	CHECK(fake_ncq == ncq + 1 && ibv_cq_ex_to_cq(cq)->cqe == 16);
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);

	qia.send_cq = qia.recv_cq = ibv_cq_ex_to_cq(cq);
	qia.send_ops_flags |= IBV_QP_EX_WITH_TSO;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &qia) == NULL && errno == EOPNOTSUPP);
	qia.send_ops_flags &= ~(uint64_t)IBV_QP_EX_WITH_TSO;
	qia.qp_type = IBV_QPT_UD;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &qia) == NULL && errno == EOPNOTSUPP);
	qia.qp_type = IBV_QPT_RC;
	CHECK(fake_nqp == nqp);
	qp = ibv_create_qp_ex(ctx, &qia);
	CHECK(qp != NULL);
	if (qp)
		qp->state = IBV_QPS_RTS; /* as a modify_qp to RTS leaves it (the fake has none) */
	if (!qp)
		return;
	sq = &fake_qps[nqp].sq;
	qpx = ibv_qp_to_qp_ex(qp);
	CHECK(qpx != NULL && qpx->wr_send && qpx->wr_rdma_write && !qpx->wr_rdma_read);
	CHECK(!qpx->wr_bind_mw && !qpx->wr_local_inv && !qpx->wr_send_inv);
	CHECK(qp->qp_num == 0x100 + nqp && qia.cap.max_inline_data == 128);
	/* The same QP as ibv_create_qp makes: modify, query, destroy work as for those. */
	CHECK(ibv_modify_qp(qp, &qattr, IBV_QP_STATE) == 0);
	memset(&qinit, 0, sizeof(qinit));
	CHECK(ibv_query_qp(qp, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit) == 0);
	CHECK(qinit.cap.max_inline_data == 128 && qattr.qp_state == IBV_QPS_INIT);

	/* Sends wait for RTS, which the fake's modify_qp does not walk to: set it as one would. */
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	CHECK(ibv_wr_complete(qpx) == EINVAL); /* in INIT */
	qp->state = IBV_QPS_RTS;

	/* Three WRs, one doorbell at wr_complete, none of them visible before. */
	nw = fake_nwqes;
	db = fake_doorbells;
	p = kernel_producer(sq);
	memcpy(buf, "metaroce ex inline", 19);
	ibv_wr_start(qpx);
	qpx->wr_id = 11;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 64);
	qpx->wr_id = 12;
	ibv_wr_send_imm(qpx, htobe32(0xc0ffee));
	ibv_wr_set_inline_data(qpx, buf, 19);
	qpx->wr_id = 13;
	ibv_wr_rdma_write(qpx, 0x2000, 0x9000);
	ibv_wr_set_sge_list(qpx, 2, sge);
	CHECK(kernel_producer(sq) == p && fake_doorbells == db);
	CHECK(ibv_wr_complete(qpx) == 0);
	CHECK(fake_doorbells == db + 1 && fake_nwqes == nw + 3 && kernel_producer(sq) == p + 3);
	CHECK(fake_wqes[nw].wr_id == 11 && fake_wqes[nw].opcode == IBV_WR_SEND);
	CHECK(fake_wqes[nw].num_sge == 1 && fake_wqes[nw].data.sge[0].length == 64);
	CHECK(fake_wqes[nw + 1].opcode == IBV_WR_SEND_WITH_IMM && fake_wqes[nw + 1].num_sge == 0);
	CHECK(fake_wqes[nw + 1].send_flags == (IBV_SEND_SIGNALED | IBV_SEND_INLINE));
	CHECK(fake_wqes[nw + 1].inline_len == 19 && fake_wqes[nw + 1].imm_data == htobe32(0xc0ffee));
	CHECK(memcmp(fake_wqes[nw + 1].data.inline_data, "metaroce ex inline", 19) == 0);
	CHECK(fake_wqes[nw + 2].remote_addr == 0x9000 && fake_wqes[nw + 2].rkey == 0x2000);
	CHECK(fake_wqes[nw + 2].num_sge == 2 && fake_wqes[nw + 2].data.sge[1].length == 28);

	/* Aborted, failed (3 SGEs > max_send_sge 2; 5 WRs in a ring of 4): nothing reaches it. */
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 8);
	ibv_wr_abort(qpx);
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_sge_list(qpx, 3, sge);
	CHECK(ibv_wr_complete(qpx) == EINVAL);
	ibv_wr_start(qpx);
	for (i = 0; i < 5; i++) {
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 8);
	}
	CHECK(ibv_wr_complete(qpx) == ENOMEM);
	CHECK(fake_doorbells == db + 1 && fake_nwqes == nw + 3 && kernel_producer(sq) == p + 3);

	/* The three completions, one at a time; their slots are freed at end_poll. */
	p = kernel_consumer(kcq);
	CHECK(ibv_start_poll(cq, &pattr) == 0);
	CHECK(cq->wr_id == 11 && cq->status == IBV_WC_SUCCESS);
	CHECK(ibv_wc_read_opcode(cq) == IBV_WC_SEND && ibv_wc_read_byte_len(cq) == 64);
	CHECK(ibv_wc_read_qp_num(cq) == qp->qp_num);
	CHECK(ibv_next_poll(cq) == 0 && cq->wr_id == 12 && ibv_wc_read_byte_len(cq) == 19);
	CHECK(ibv_next_poll(cq) == 0 && cq->wr_id == 13);
	CHECK(ibv_wc_read_opcode(cq) == IBV_WC_RDMA_WRITE && ibv_wc_read_byte_len(cq) == 128);
	CHECK(ibv_next_poll(cq) == ENOENT);
	CHECK(kernel_consumer(kcq) == p);
	ibv_end_poll(cq);
	CHECK(kernel_consumer(kcq) == p + 3);

	/* A receive completion: every field the CQE carries. */
	cqe.wr_id = 78;
	cqe.opcode = IBV_WC_RECV;
	cqe.vendor_err = 5;
	cqe.byte_len = 32;
	cqe.imm_data = htobe32(0xbeef);
	cqe.qp_num = qp->qp_num;
	cqe.src_qp = 0x333;
	cqe.wc_flags = IBV_WC_WITH_IMM | IBV_WC_GRH;
	cqe.slid = 0x1234;
	cqe.sl = 2;
	cqe.dlid_path_bits = 9;
	fake_complete(ncq, &cqe);
	CHECK(ibv_start_poll(cq, &pattr) == 0 && cq->wr_id == 78);
	CHECK(ibv_wc_read_opcode(cq) == IBV_WC_RECV && ibv_wc_read_vendor_err(cq) == 5);
	CHECK(ibv_wc_read_imm_data(cq) == htobe32(0xbeef) && ibv_wc_read_src_qp(cq) == 0x333);
	CHECK(ibv_wc_read_wc_flags(cq) == (IBV_WC_WITH_IMM | IBV_WC_GRH));
	CHECK(ibv_wc_read_slid(cq) == 0x1234 && ibv_wc_read_sl(cq) == 2);
	CHECK(ibv_wc_read_dlid_path_bits(cq) == 9);
	ibv_end_poll(cq);
	/* ibv_poll_cq works on an extended CQ too. */
	cqe.wr_id = 79;
	fake_complete(ncq, &cqe);
	CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 2, &wc) == 1 && wc.wr_id == 79 && wc.src_qp == 0x333);
	CHECK(ibv_destroy_qp(qp) == 0);

	/*
	 * UD: the two sends only; ibv_wr_set_ud_addr before or after the data setter gives the WQE
	 * its address vector. The AH needs no command (the port count is known by now).
	 */
	qia.qp_type = IBV_QPT_UD;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &qia) == NULL && errno == EOPNOTSUPP); /* RDMA_WRITE, FAA */
	qia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	nqp = fake_nqp;
	calls = fake_ncalls;
	ah = ibv_create_ah(pd, &aa);
	CHECK(ah != NULL && fake_ncalls == calls);
	qp = ibv_create_qp_ex(ctx, &qia);
	CHECK(qp != NULL);
	if (qp)
		qp->state = IBV_QPS_RTS; /* as a modify_qp to RTS leaves it (the fake has none) */
	if (qp && ah) {
		struct metaroce_send_wqe uw[2];
		struct metaroce_ud_av av;

		sq = &fake_qps[nqp].sq;
		qpx = ibv_qp_to_qp_ex(qp);
		CHECK(qpx->wr_send && qpx->wr_send_imm && !qpx->wr_rdma_write);
		p = kernel_producer(sq);
		db = fake_doorbells;
		ibv_wr_start(qpx);
		qpx->wr_id = 21;
		qpx->wr_flags = 0;
		ibv_wr_send(qpx);
		ibv_wr_set_ud_addr(qpx, ah, 0x456, 0x11);
		ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 8);
		qpx->wr_id = 22;
		ibv_wr_send_imm(qpx, htobe32(7));
		ibv_wr_set_inline_data(qpx, buf, 4);
		ibv_wr_set_ud_addr(qpx, ah, 0x789, 0x22);
		CHECK(ibv_wr_complete(qpx) == 0);
		CHECK(fake_doorbells == db + 1 && kernel_producer(sq) == p + 2);
		memcpy(&uw[0], ring_entry(sq, p), sizeof(uw[0]));
		memcpy(&uw[1], ring_entry(sq, p + 1), sizeof(uw[1]));
		memcpy(&av, (const char *)&uw[0] + METAROCE_UD_AV_OFFSET, sizeof(av));
		CHECK(uw[0].wr_id == 21 && uw[0].num_sge == 1 && memcmp(av.dgid, aa.grh.dgid.raw, 16) == 0);
		CHECK(av.remote_qpn == 0x456 && av.remote_qkey == 0x11 && !av.reserved[0]);
		memcpy(&av, (const char *)&uw[1] + METAROCE_UD_AV_OFFSET, sizeof(av));
		CHECK(uw[1].wr_id == 22 && uw[1].inline_len == 4 && uw[1].imm_data == htobe32(7));
		CHECK(av.remote_qpn == 0x789 && av.remote_qkey == 0x22 && !av.reserved[1]);
		CHECK(memcmp(av.dgid, aa.grh.dgid.raw, 16) == 0);
		/* No address: the batch fails, nothing reaches the fake. */
		ibv_wr_start(qpx);
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 8);
		CHECK(ibv_wr_complete(qpx) == EINVAL && kernel_producer(sq) == p + 2);
		CHECK(fake_doorbells == db + 1);
	}
	CHECK(!qp || ibv_destroy_qp(qp) == 0);
	CHECK(!ah || ibv_destroy_ah(ah) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

/* PD, MR, CQ, QP, SRQ and the rings, end to end through libibverbs. */
static void check_data_path(struct ibv_context *ctx)
{
	static char buf[4096];
	struct ibv_qp_init_attr ia = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_sge sge[3] = {
		{ .addr = (uintptr_t)buf, .length = 100, .lkey = 0x1000 },
		{ .addr = (uintptr_t)buf + 100, .length = 28, .lkey = 0x1000 },
		{ .addr = (uintptr_t)buf + 128, .length = 8, .lkey = 0x1000 },
	};
	struct ibv_send_wr wr[4], *bad = NULL;
	struct ibv_recv_wr rwr = { .wr_id = 77, .sg_list = sge, .num_sge = 2 }, *rbad = NULL;
	struct ibv_qp_attr qattr = { .qp_state = IBV_QPS_INIT };
	struct ibv_qp_init_attr qinit;
	struct ibv_srq_attr sattr = { .max_wr = 8, .srq_limit = 1 };
	struct metaroce_recv_wqe rwqe;
	struct metaroce_cqe cqe = { 0 };
	struct ibv_wc wc[8];
	struct ibv_srq *srq;
	struct ibv_cq *cq;
	struct ibv_qp *qp, *sqp;
	struct ibv_ah_attr aa = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid.raw = { [10] = 0xff, [11] = 0xff, [12] = 10, [13] = 0, [14] = 0, [15] = 2 } },
	};
	struct ibv_ah *ah;
	unsigned int nqp, nqd, ncalls;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	int i;

	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	if (!pd)
		return;
	mr = ibv_reg_mr_iova(pd, buf, sizeof(buf), 0x7000000, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	if (!mr)
		return;
	CHECK(fake_last_hca_va == 0x7000000);
	CHECK(mr->lkey == 0x1000 && mr->rkey == 0x2000 && mr->addr == buf);
	/* ibv_rereg_mr: new rights, then new memory named by its own address; the keys the
	 * kernel answers are the MR's. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
	CHECK(fake_last_rereg.flags == IBV_REREG_MR_CHANGE_ACCESS &&
	      fake_last_rereg.access_flags == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD, pd,
			   buf + 64, 128, 0) == 0);
	CHECK(fake_last_rereg.start == (uintptr_t)(buf + 64) &&
	      fake_last_rereg.hca_va == (uintptr_t)(buf + 64) && fake_last_rereg.length == 128 &&
	      fake_last_rereg.pd_handle == pd->handle);
	CHECK(mr->lkey == 0x1000 && mr->rkey == 0x2000 && mr->addr == buf + 64 &&
	      mr->length == 128 && mr->pd == pd);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf, sizeof(buf), 0) == 0);
	CHECK(mr->addr == buf && mr->length == sizeof(buf));
	CHECK(fake_calls[IB_USER_VERBS_CMD_REREG_MR] == 3);

	/* A CQ whose ring the provider cannot use: refused, the kernel CQ destroyed. */
	fake_cq_entries_override = 3;
	errno = 0;
	CHECK(ibv_create_cq(ctx, 16, NULL, NULL, 0) == NULL);
	CHECK(errno == EPROTO);
	CHECK(fake_calls[IB_USER_VERBS_CMD_DESTROY_CQ] == 1);
	fake_cq_entries_override = 0;

	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL);
	if (!cq)
		return;
	CHECK(cq->cqe == 16);
	ia.send_cq = ia.recv_cq = cq;
	qp = ibv_create_qp(pd, &ia);
	CHECK(qp != NULL);
	/* Posting waits for RTS (libibverbs' record of the state): refused in RESET. */
	if (qp) {
		struct ibv_send_wr w0 = { .opcode = IBV_WR_SEND }, *b0 = NULL;
		CHECK(ibv_post_send(qp, &w0, &b0) == EINVAL && b0 == &w0);
	}
	if (qp)
		qp->state = IBV_QPS_RTS; /* as a modify_qp to RTS leaves it (the fake has none) */
	if (!qp)
		return;
	CHECK(qp->qp_num == 0x100);
	CHECK(ia.cap.max_inline_data == 128); /* the driver response's value */
	CHECK(fake_mmaps == 3); /* CQ, SQ, RQ (the refused CQ was never mapped) */
	CHECK(ibv_modify_qp(qp, &qattr, IBV_QP_STATE) == 0);
	check_dv(qp);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(fake_calls[IB_USER_VERBS_CMD_REQ_NOTIFY_CQ] == 1);

	/* Receive: one WQE in the RQ ring, no doorbell. */
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
	CHECK(kernel_producer(&fake_qps[0].rq) == FAKE_RING_START + 1);
	memcpy(&rwqe, ring_entry(&fake_qps[0].rq, FAKE_RING_START), sizeof(rwqe));
	CHECK(rwqe.wr_id == 77 && rwqe.num_sge == 2 && rwqe.sge[1].length == 28);
	rwr.num_sge = 3; /* more than the QP's max_recv_sge (2) */
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr);
	rwr.num_sge = 2;

	/* Sends wait for RTS, which the fake's modify_qp does not walk to: set it as one would. */
	qp->state = IBV_QPS_RTS;

	/* Send: an inline SEND_WITH_IMM and an RDMA_WRITE, one doorbell, two completions. */
	memset(wr, 0, sizeof(wr));
	memcpy(buf, "metaroce inline payload", 24);
	wr[0] = (struct ibv_send_wr){
		.wr_id = 1, .next = &wr[1], .sg_list = sge, .num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		.imm_data = htobe32(0xc0ffee),
	};
	wr[1] = (struct ibv_send_wr){
		.wr_id = 2, .sg_list = sge, .num_sge = 2,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = 0x9000, .rkey = 0x2000 },
	};
	CHECK(ibv_post_send(qp, &wr[0], &bad) == 0);
	CHECK(fake_doorbells == 1 && fake_nwqes == 2);
	CHECK(fake_wqes[0].opcode == IBV_WR_SEND_WITH_IMM && fake_wqes[0].num_sge == 0);
	CHECK(fake_wqes[0].inline_len == 100 && fake_wqes[0].imm_data == htobe32(0xc0ffee));
	CHECK(memcmp(fake_wqes[0].data.inline_data, "metaroce inline payload", 24) == 0);
	CHECK(fake_wqes[1].num_sge == 2 && fake_wqes[1].remote_addr == 0x9000);
	CHECK(fake_wqes[1].data.sge[1].addr == (uintptr_t)buf + 100);
	CHECK(ibv_poll_cq(cq, 1, wc) == 1);
	CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_SEND);
	CHECK(wc[0].qp_num == 0x100 && wc[0].byte_len == 100);
	CHECK(ibv_poll_cq(cq, 8, wc) == 1);
	CHECK(wc[0].wr_id == 2 && wc[0].opcode == IBV_WC_RDMA_WRITE && wc[0].byte_len == 128);
	CHECK(ibv_poll_cq(cq, 8, wc) == 0);
	CHECK(kernel_consumer(&fake_cqs[1]) == FAKE_RING_START + 2); /* wrapped past 2^32 */

	/* ibv_resize_cq: three completions waiting move to the new ring, which is mapped in
	 * place of the old and polled from its start; a later one lands there too. */
	for (i = 0; i < 3; i++) {
		cqe.wr_id = 41 + i;
		fake_complete(1, &cqe);
	}
	nqp = fake_mmaps;
	CHECK(ibv_resize_cq(cq, 1) == EINVAL && fake_mmaps == nqp); /* a ring of 2 */
	CHECK(ibv_resize_cq(cq, 40) == 0 && cq->cqe == 63 && fake_mmaps == nqp + 1);
	CHECK(fake_cqs[1].n == 64 && kernel_consumer(&fake_cqs[1]) == FAKE_RING_START);
	cqe.wr_id = 44;
	fake_complete(1, &cqe);
	CHECK(ibv_poll_cq(cq, 8, wc) == 4);
	CHECK(wc[0].wr_id == 41 && wc[1].wr_id == 42 && wc[2].wr_id == 43 && wc[3].wr_id == 44);
	CHECK(kernel_consumer(&fake_cqs[1]) == FAKE_RING_START + 4);
	CHECK(ibv_poll_cq(cq, 8, wc) == 0);

	/* A QP reset takes its completions not polled yet out of its CQ; another QP's stay. */
	for (i = 0; i < 3; i++) {
		cqe.wr_id = 51 + i;
		cqe.qp_num = i == 1 ? 0x777 : 0x100;
		fake_complete(1, &cqe);
	}
	qattr.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(qp, &qattr, IBV_QP_STATE) == 0);
	CHECK(ibv_poll_cq(cq, 8, wc) == 1 && wc[0].wr_id == 52 && wc[0].qp_num == 0x777);
	CHECK(ibv_poll_cq(cq, 8, wc) == 0);
	cqe.qp_num = 0;
	qp->state = IBV_QPS_RTS; /* as a modify_qp to RTS leaves it (the fake has none) */

	/* A list with a bad second WR: the first is posted and rung, the rest untouched. */
	wr[0].next = &wr[1];
	wr[1].next = &wr[2];
	wr[1].num_sge = 3; /* > max_send_sge (2) */
	wr[2] = wr[0];
	wr[2].next = NULL;
	CHECK(ibv_post_send(qp, &wr[0], &bad) == EINVAL);
	CHECK(bad == &wr[1]);
	CHECK(fake_doorbells == 2 && fake_nwqes == 3);
	/* Unsupported opcode first: nothing posted, no doorbell. */
	wr[1].num_sge = 1;
	wr[1].opcode = IBV_WR_TSO;
	CHECK(ibv_post_send(qp, &wr[1], &bad) == EINVAL && bad == &wr[1]);
	CHECK(fake_doorbells == 2);
	/* Inline data over the QP's max_inline_data (128). */
	sge[2].length = 129;
	wr[2].sg_list = &sge[2];
	CHECK(ibv_post_send(qp, &wr[2], &bad) == EINVAL && bad == &wr[2]);
	sge[2].length = 8;
	/* Atomics. */
	wr[3] = (struct ibv_send_wr){
		.wr_id = 4, .sg_list = &sge[2], .num_sge = 1,
		.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = 0x9008, .compare_add = 5, .rkey = 0x2000 },
	};
	CHECK(ibv_post_send(qp, &wr[3], &bad) == 0);
	CHECK(fake_nwqes == 4 && fake_wqes[3].compare_add == 5 && fake_wqes[3].rkey == 0x2000);
	CHECK(ibv_poll_cq(cq, 8, wc) == 2);
	CHECK(wc[0].wr_id == 1 && wc[1].wr_id == 4 && wc[1].opcode == IBV_WC_FETCH_ADD);
	/* Memory windows: a type 1 bind is a BIND_MW WQE with the window's next rkey, which it
	 * takes; a LOCAL_INV carries the rkey in imm_data. No data either way. */
	{
		struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
		struct ibv_mw_bind mb = {
			.wr_id = 5, .send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = mr, .addr = (uintptr_t)buf, .length = 64,
				       .mw_access_flags = IBV_ACCESS_REMOTE_READ },
		};
		struct ibv_send_wr inv = { .wr_id = 6, .opcode = IBV_WR_LOCAL_INV,
					   .send_flags = IBV_SEND_SIGNALED,
					   .invalidate_rkey = 0x80000107 };

		CHECK(mw && mw->rkey == 0x80000100 && mw->type == IBV_MW_TYPE_1);
		CHECK(ibv_bind_mw(qp, mw, &mb) == 0 && mw->rkey == 0x80000101);
		CHECK(fake_nwqes == 5 && fake_wqes[4].opcode == IBV_WR_BIND_MW);
		CHECK(fake_wqes[4].rkey == 0x80000100 && fake_wqes[4].imm_data == 0x80000101);
		CHECK(fake_wqes[4].remote_addr == (uintptr_t)buf && fake_wqes[4].compare_add == 64);
		CHECK(fake_wqes[4].swap == (((__u64)IBV_ACCESS_REMOTE_READ << 32) | mr->lkey));
		CHECK(fake_wqes[4].num_sge == 0 && fake_wqes[4].inline_len == 0);
		CHECK(ibv_post_send(qp, &inv, &bad) == 0);
		CHECK(fake_nwqes == 6 && fake_wqes[5].imm_data == 0x80000107 && fake_wqes[5].rkey == 0);
		mb.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED; /* not on type 1 */
		CHECK(ibv_bind_mw(qp, mw, &mb) == EINVAL && fake_nwqes == 6);
		CHECK(ibv_poll_cq(cq, 8, wc) == 2 && wc[0].wr_id == 5 && wc[1].wr_id == 6);
		CHECK(ibv_dealloc_mw(mw) == 0);
	}
	check_dv_rings(qp, cq);

	/* A receive completion with immediate data, translated 1:1. */
	cqe.wr_id = 77;
	cqe.status = IBV_WC_SUCCESS;
	cqe.opcode = IBV_WC_RECV;
	cqe.byte_len = 64;
	cqe.imm_data = htobe32(0xc0ffee);
	cqe.qp_num = 0x100;
	cqe.src_qp = 0x222;
	cqe.wc_flags = IBV_WC_WITH_IMM;
	cqe.sl = 3;
	fake_complete(1, &cqe);
	CHECK(ibv_poll_cq(cq, 8, wc) == 1);
	CHECK(wc[0].wr_id == 77 && wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == 64);
	CHECK(wc[0].imm_data == htobe32(0xc0ffee) && wc[0].wc_flags == IBV_WC_WITH_IMM);
	CHECK(wc[0].src_qp == 0x222 && wc[0].sl == 3);

	memset(&qinit, 0, sizeof(qinit));
	CHECK(ibv_query_qp(qp, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit) == 0);
	CHECK(qinit.cap.max_inline_data == 128 && qattr.qp_state == IBV_QPS_INIT);

	/* SRQ. */
	srq = ibv_create_srq(pd, &sia);
	CHECK(srq != NULL);
	if (srq) {
		rwr.num_sge = 1;
		rwr.wr_id = 88;
		CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == 0);
		CHECK(kernel_producer(&fake_srqs[0]) == FAKE_RING_START + 1);
		memcpy(&rwqe, ring_entry(&fake_srqs[0], FAKE_RING_START), sizeof(rwqe));
		CHECK(rwqe.wr_id == 88 && rwqe.num_sge == 1 && rwqe.sge[0].lkey == 0x1000);
		for (i = 0; i < 3; i++)
			CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == 0);
		CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == ENOMEM && rbad == &rwr); /* full */
		/* Resize: the four posted move to a ring of 16 in order, mapped in place of the
		 * old one; posting goes on behind them; a ring they do not fit is EINVAL. */
		sattr.max_wr = 2;
		CHECK(ibv_modify_srq(srq, &sattr, IBV_SRQ_MAX_WR) == EINVAL);
		i = fake_mmaps;
		sattr.max_wr = 9;
		CHECK(ibv_modify_srq(srq, &sattr, IBV_SRQ_MAX_WR) == 0 && fake_mmaps == i + 1);
		CHECK(fake_srqs[0].n == 16 && kernel_producer(&fake_srqs[0]) == FAKE_RING_START + 4);
		memcpy(&rwqe, ring_entry(&fake_srqs[0], FAKE_RING_START + 3), sizeof(rwqe));
		CHECK(rwqe.wr_id == 88 && rwqe.sge[0].lkey == 0x1000);
		rwr.wr_id = 89;
		for (i = 0; i < 12; i++)
			CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == 0);
		CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == ENOMEM); /* 16 posted */
		memcpy(&rwqe, ring_entry(&fake_srqs[0], FAKE_RING_START + 4), sizeof(rwqe));
		CHECK(rwqe.wr_id == 89 && kernel_producer(&fake_srqs[0]) == FAKE_RING_START + 16);
		CHECK(ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT) == 0);

		/* A QP receiving through the SRQ has no RQ ring: post_recv is refused. */
		ia.srq = srq;
		ia.cap.max_inline_data = 0;
		sqp = ibv_create_qp(pd, &ia);
		CHECK(sqp != NULL);
		if (sqp)
			sqp->state = IBV_QPS_RTS; /* as a modify_qp to RTS leaves it (the fake has none) */
		if (sqp) {
			CHECK(ibv_post_recv(sqp, &rwr, &rbad) == EINVAL && rbad == &rwr);
			CHECK(ibv_destroy_qp(sqp) == 0);
		}
		ia.srq = NULL;
		CHECK(ibv_destroy_srq(srq) == 0);
	}

	/*
	 * Address handles, in the provider alone: refused without a GRH, on port 0 or 2 (the
	 * fake device has one), to the zero GID. The first one with good attributes otherwise
	 * asks the port count (one QUERY_DEVICE, once per context); nothing else reaches the
	 * kernel.
	 */
	ncalls = fake_ncalls;
	nqd = fake_calls[IB_USER_VERBS_CMD_QUERY_DEVICE];
	for (i = 0; i < 4; i++) {
		struct ibv_ah_attr bad_aa = aa;

		if (i == 0)
			bad_aa.is_global = 0;
		else if (i == 1)
			bad_aa.port_num = 0;
		else if (i == 2)
			bad_aa.port_num = 2;
		else
			memset(&bad_aa.grh.dgid, 0, sizeof(bad_aa.grh.dgid));
		errno = 0;
		CHECK(ibv_create_ah(pd, &bad_aa) == NULL && errno == EINVAL);
	}
	ah = ibv_create_ah(pd, &aa);
	CHECK(ah != NULL && fake_calls[IB_USER_VERBS_CMD_QUERY_DEVICE] == nqd + 1);
	CHECK(fake_ncalls == ncalls + 1);

	/*
	 * UD: a send names its AH, remote QPN and Q_Key; the WQE carries struct metaroce_ud_av at
	 * METAROCE_UD_AV_OFFSET. No AH, or an RDMA write: EINVAL. Receives work as on RC.
	 */
	ia.qp_type = IBV_QPT_UD;
	nqp = fake_nqp;
	sqp = ibv_create_qp(pd, &ia);
	CHECK(sqp != NULL && ah != NULL);
	if (sqp)
		sqp->state = IBV_QPS_RTS; /* as a modify_qp to RTS leaves it (the fake has none) */
	if (sqp && ah) {
		const struct fake_ring *usq = &fake_qps[nqp].sq;
		struct metaroce_send_wqe uw;
		struct metaroce_ud_av av;
		__u32 up = kernel_producer(usq);

		wr[0] = (struct ibv_send_wr){
			.wr_id = 90, .sg_list = sge, .num_sge = 1, .opcode = IBV_WR_SEND,
			.wr.ud = { .ah = NULL, .remote_qpn = 0x123, .remote_qkey = 0x80000000 },
		};
		CHECK(ibv_post_send(sqp, &wr[0], &bad) == EINVAL && bad == &wr[0]);
		wr[0].wr.ud.ah = ah;
		wr[0].opcode = IBV_WR_RDMA_WRITE;
		CHECK(ibv_post_send(sqp, &wr[0], &bad) == EINVAL && bad == &wr[0]);
		CHECK(kernel_producer(usq) == up);
		wr[0].opcode = IBV_WR_SEND;
		CHECK(ibv_post_send(sqp, &wr[0], &bad) == 0);
		CHECK(kernel_producer(usq) == up + 1 && kernel_consumer(usq) == up + 1);
		memcpy(&uw, ring_entry(usq, up), sizeof(uw));
		memcpy(&av, (const char *)&uw + METAROCE_UD_AV_OFFSET, sizeof(av));
		CHECK(uw.wr_id == 90 && uw.opcode == IBV_WR_SEND && uw.num_sge == 1);
		CHECK(uw.data.sge[0].length == 100 && uw.imm_data == 0);
		CHECK(memcmp(av.dgid, aa.grh.dgid.raw, 16) == 0);
		CHECK(av.remote_qpn == 0x123 && av.remote_qkey == 0x80000000);
		CHECK(av.reserved[0] == 0 && av.reserved[1] == 0);
		CHECK(ibv_post_recv(sqp, &rwr, &rbad) == 0);
		CHECK(ibv_destroy_qp(sqp) == 0);
	}
	CHECK(!ah || ibv_destroy_ah(ah) == 0);

	/* A QP made by ibv_create_qp has no ibv_qp_ex. */
	CHECK(ibv_qp_to_qp_ex(qp) == NULL);
	check_ex(ctx, pd, mr, buf);

	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(fake_calls[IB_USER_VERBS_CMD_DESTROY_QP] == 5);
	CHECK(fake_calls[IB_USER_VERBS_CMD_DESTROY_CQ] == 3);
	CHECK(fake_calls[IB_USER_VERBS_CMD_DEREG_MR] == 1);
	CHECK(fake_calls[IB_USER_VERBS_CMD_DEALLOC_PD] == 1);
}

int main(int argc, char **argv)
{
	const struct verbs_match_ent *ent;
	struct ibv_device_attr_ex dattr;
	struct ibv_port_attr pattr;
	struct verbs_sysfs_dev *sysfs;
	struct verbs_device *vdev;
	struct verbs_context *vctx;
	void *handle;

	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: %s PLUGIN.so [LIBRARY.so]\n", argv[0]);
		return 2;
	}
	fake_memfd = memfd_create("metaroce-fake-device", MFD_CLOEXEC);
	if (fake_memfd < 0 || ftruncate(fake_memfd, FAKE_MEM_SIZE)) {
		perror("load-check: memfd");
		return 1;
	}
	fake_mem = (void *)syscall(SYS_mmap, NULL, FAKE_MEM_SIZE, PROT_READ | PROT_WRITE,
				   MAP_SHARED, fake_memfd, 0);
	if (fake_mem == MAP_FAILED) {
		perror("load-check: mmap");
		return 1;
	}
	handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		fprintf(stderr, "load-check: dlopen: %s\n", dlerror());
		return 1;
	}

	/* The library under its own name: the same object, its constructor ran once. */
	if (argc == 3) {
		void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);

		CHECK(lib == handle);
		if (lib)
			dlclose(lib);
	}

	/* Registration. */
	CHECK(registrations == 1);
	if (!registered) {
		fprintf(stderr, "load-check: the constructor registered nothing\n");
		return 1;
	}
	if (resolve_dv(handle))
		return 1;
	CHECK(strcmp(registered->name, "metaroce") == 0);
	CHECK(registered->match_min_abi_version == METAROCE_UVERBS_ABI_VERSION);
	CHECK(registered->match_max_abi_version == METAROCE_UVERBS_ABI_VERSION);
	CHECK(registered->static_providers == NULL);
	CHECK(registered->match_device == NULL);
	CHECK(registered->import_context == NULL);
	CHECK(registered->alloc_device && registered->uninit_device &&
	      registered->alloc_context);
	ent = registered->match_table;
	CHECK(ent != NULL);
	if (!ent || !registered->alloc_device || !registered->alloc_context)
		return 1;
	CHECK(ent[0].kind == VERBS_MATCH_DRIVER_ID);
	CHECK(ent[0].u.driver_id == METAROCE_DRIVER_ID);
	CHECK(ent[1].kind == VERBS_MATCH_SENTINEL);

	/* The device, set up as try_driver() does. */
	sysfs = calloc(1, sizeof(*sysfs));
	sysfs->abi_ver = METAROCE_UVERBS_ABI_VERSION;
	vdev = registered->alloc_device(sysfs);
	CHECK(vdev != NULL);
	if (!vdev)
		return 1;
	vdev->ops = registered;
	vdev->sysfs = sysfs;
	atomic_init(&vdev->refcount, 1);

	/* A kernel speaking another ABI: refused with EPROTO, everything released. */
	vctx = open_fake(vdev, METAROCE_UVERBS_ABI_VERSION + 1);
	CHECK(vctx == NULL);
	CHECK(errno == EPROTO);
	CHECK(fake_calls[IB_USER_VERBS_CMD_GET_CONTEXT] == 1);
	CHECK(!fd_is_open(fake_fd));
	CHECK(!fd_is_open(fake_async_fd));
	CHECK(atomic_load(&vdev->refcount) == 1);

	/* Our ABI: a working context. */
	vctx = open_fake(vdev, METAROCE_UVERBS_ABI_VERSION);
	CHECK(vctx != NULL);
	if (!vctx)
		return 1;
	CHECK(vctx->context.cmd_fd == fake_fd);
	CHECK(vctx->context.async_fd == fake_async_fd);
	CHECK(vctx->context.num_comp_vectors == 1);
	CHECK(atomic_load(&vdev->refcount) == 2);
	CHECK(provider_ops != NULL);
	if (!provider_ops)
		return 1;
	check_context_ops(provider_ops);

	memset(&dattr, 0xff, sizeof(dattr));
	CHECK(ibv_query_device_ex(&vctx->context, NULL, &dattr) == 0);
	CHECK(strcmp(dattr.orig_attr.fw_ver, "1.2.3") == 0);
	CHECK(dattr.orig_attr.vendor_id == 0x1234);
	CHECK(dattr.orig_attr.vendor_part_id == 0x4d52);
	CHECK(dattr.orig_attr.max_qp_rd_atom == 16);
	CHECK(dattr.orig_attr.phys_port_cnt == 1);

	CHECK(ibv_query_port(&vctx->context, 1, &pattr) == 0);
	CHECK(pattr.state == IBV_PORT_ACTIVE);
	CHECK(pattr.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(pattr.active_mtu == IBV_MTU_1024);
	CHECK(pattr.gid_tbl_len == 16);
	CHECK(ibv_query_port(&vctx->context, 2, &pattr) == EINVAL);

	check_data_path(&vctx->context);

	/* ibv_close_device() -> free_context. */
	CHECK(ibv_close_device(&vctx->context) == 0);
	CHECK(!fd_is_open(fake_fd));
	CHECK(!fd_is_open(fake_async_fd));
	CHECK(atomic_load(&vdev->refcount) == 1);

	registered->uninit_device(vdev);
	free(sysfs);

	if (failures)
		return 1;
	printf("load-check: %s registered \"%s\" (driver id 0x%llx, uverbs ABI %u..%u); "
	       "alloc_context/query_device_ex/query_port/close, the data path (PD, MR, CQ, QP, "
	       "SRQ, post_send/recv, poll_cq over shared rings; AHs and UD sends), the extended CQ "
	       "and QP verbs "
	       "(create_cq_ex, start/next/end_poll, create_qp_ex, ibv_wr_*) and the direct verbs "
	       "(metaroce_dv_*@METAROCE_1.0, 1.1) work against a fake uverbs, a wrong ABI is refused\n",
	       argv[1], registered->name, (unsigned long long)ent[0].u.driver_id,
	       registered->match_min_abi_version, registered->match_max_abi_version);
	return 0;
}
