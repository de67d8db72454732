// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * metaroce_hostile_test: a malicious application against the metaroce kernel module. It gets
 * its QPs' rings with metaroce_dv_qp_rings() (<infiniband/metaroce_dv.h>) and writes into
 * them what no provider would, rings the doorbell (metaroce_dv_qp_doorbell()), and checks that
 * the kernel fails exactly the QP it was done to, says so, and keeps everything else working:
 *
 *   metaroce_hostile_test [--seed N] [--timeout SEC] [--storm N] DEV1 DEV2
 *
 * Each case connects a fresh RC QP pair, DEV1's QP to DEV2's (port 1, the IPv4-mapped GID), and
 * attacks DEV1's QP:
 *
 *   sq_garbage   a WQE of random bytes (an invalid opcode) then 3 valid RDMA WRITEs in the SQ,
 *                doorbell: QP_FATAL, IBV_QPS_ERR, the 4 WQEs flushed in ring order
 *   sq_overflow  2 valid WRITEs, the producer index 2^30 beyond the ring, doorbell: QP_FATAL,
 *                IBV_QPS_ERR, nothing taken (no completion, consumer index unmoved, the peer's
 *                buffer untouched); the index put back, doorbell: the 2 WQEs flushed
 *   rq_overflow  2 receives posted (and taken into the transport by a doorbell), the RQ
 *                producer index 2^31 away, doorbell: QP_FATAL, IBV_QPS_ERR, both receives flushed
 *   rq_garbage   a receive WQE of random bytes (too many SGEs) and a valid one in the RQ, no
 *                doorbell; the peer SENDs: QP_FATAL, IBV_QPS_ERR, both flushed, nothing placed,
 *                the peer's SEND does not succeed
 *   long_list    a valid WRITE, then a WRITE with 6 SGEs (the QP was created with max_send_sge
 *                1; the provider would have refused it, the device carries 12), then another
 *                valid WRITE, doorbell: the first succeeds, the second completes with
 *                IBV_WC_LOC_QP_OP_ERR after it, the third flushes, IBV_QPS_ERR, no QP_FATAL
 *                and no ring error (the entry is well formed: a bad request, not a broken ring)
 *   storm        random producer indices and random entries in the SQ, each with a doorbell,
 *                --storm times: one QP_FATAL, IBV_QPS_ERR; then --storm empty doorbells on a
 *                well-behaved QP, which still writes and sends correct data, and --storm
 *                doorbells on the QP of sq_garbage (in the error state)
 *   destroy      the RQ producer index broken while the peer SENDs, the QP destroyed at once
 *   healthy      after all that, a new pair: an RDMA WRITE of 64 KiB and a SEND, verified
 *
 * and finally that each failed QP got exactly one IBV_EVENT_QP_FATAL and every other QP none,
 * and that everything is destroyed cleanly. Every result is a line "ok <name>" or
 * "FAIL <name>: <why>" (the guest test, selftests/tests/hostile.sh, asserts each name); exit
 * status 0 if all passed, 1 if one failed, 2 for bad arguments, 3 if the setup failed.
 * Five QPs of DEV1 fail by a ring error before `destroy`: its hardware counter ring_errors
 * (/sys/class/infiniband/DEV/ports/1/hw_counters/) must have grown by exactly 5 then, DEV2's not
 * at all.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/metaroce_dv.h>
#include <infiniband/verbs.h>

#define PROG "metaroce_hostile_test"
#define BUF_SIZE 65536
#define MAX_QPS 32

struct dev {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	int gid_index;
};

struct end {
	struct dev *dev;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
};

struct pair {
	const char *name;
	struct end a, b;	/* a on DEV1 (the one attacked), b on DEV2 */
	int fails;		/* a's QP is to fail (one QP_FATAL) */
	int destroyed;
};

static int timeout_s = 20;
static long storm = 5000;
static uint64_t rng = 1;
static int failures;

/* QP_FATAL events seen, per QP of DEV1 (by address), and any other event. */
static struct {
	struct ibv_qp *qp;
	int fatal, other;
} seen[MAX_QPS];
static int other_events;

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, PROG ": setup: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(3);
}

static void __attribute__((format(printf, 3, 4))) result(int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (ok) {
		printf("ok %s\n", name);
	} else {
		failures++;
		printf("FAIL %s: ", name);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
	}
	fflush(stdout);
}

static uint64_t next_random(void)
{
	/* xorshift64 */
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void random_bytes(void *dst, size_t len)
{
	uint8_t *p = dst;
	size_t i;

	for (i = 0; i < len; i++)
		p[i] = (uint8_t)(next_random() >> 24);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct ibv_device *find_device(struct ibv_device **list, const char *name)
{
	for (; *list; list++)
		if (!strcmp(ibv_get_device_name(*list), name))
			return *list;
	die("no RDMA device %s", name);
}

static void open_dev(struct dev *d, struct ibv_device *device)
{
	int flags;

	if (!metaroce_dv_is_supported(device))
		die("%s is not a metaroce device", d->name);
	d->ctx = ibv_open_device(device);
	if (!d->ctx)
		die("ibv_open_device %s: %s", d->name, strerror(errno));
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		die("ibv_alloc_pd on %s: %s", d->name, strerror(errno));
	flags = fcntl(d->ctx->async_fd, F_GETFL);
	if (flags < 0 || fcntl(d->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
		die("async fd of %s: %s", d->name, strerror(errno));
	/* The IPv4-mapped GID (::ffff:a.b.c.d): the data path has IPv4 peers only. */
	for (d->gid_index = 0; d->gid_index < 16; d->gid_index++) {
		if (ibv_query_gid(d->ctx, 1, d->gid_index, &d->gid))
			continue;
		if (!d->gid.global.subnet_prefix &&
		    (be64toh(d->gid.global.interface_id) >> 32) == 0xffff)
			return;
	}
	die("%s: no IPv4-mapped GID on port 1", d->name);
}

static void make_end(struct end *e, struct dev *d)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	e->dev = d;
	e->cq = ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
	if (!e->cq)
		die("ibv_create_cq on %s: %s", d->name, strerror(errno));
	init.send_cq = init.recv_cq = e->cq;
	e->qp = ibv_create_qp(d->pd, &init);
	if (!e->qp)
		die("ibv_create_qp on %s: %s", d->name, strerror(errno));
	if (posix_memalign((void **)&e->buf, 4096, BUF_SIZE))
		die("no memory");
	memset(e->buf, 0, BUF_SIZE);
	e->mr = ibv_reg_mr(d->pd, e->buf, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!e->mr)
		die("ibv_reg_mr on %s: %s", d->name, strerror(errno));
}

/* RESET -> INIT -> RTR -> RTS towards peer, with the usual pingpong values. */
static void connect_qp(struct end *s, const struct end *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	int ret;

	ret = ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret)
		die("modify_qp to INIT on %s: %s", s->dev->name, strerror(ret));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->dev->gid;
	a.ah_attr.grh.sgid_index = s->dev->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	ret = ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (ret)
		die("modify_qp to RTR on %s: %s", s->dev->name, strerror(ret));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	ret = ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret)
		die("modify_qp to RTS on %s: %s", s->dev->name, strerror(ret));
}

static int npairs;
static struct pair *pairs[MAX_QPS];

static struct pair *new_pair(const char *name, struct dev *d1, struct dev *d2, int fails)
{
	struct pair *p = calloc(1, sizeof(*p));
	int i;

	if (!p || npairs == MAX_QPS)
		die("too many pairs");
	p->name = name;
	p->fails = fails;
	make_end(&p->a, d1);
	make_end(&p->b, d2);
	connect_qp(&p->a, &p->b);
	connect_qp(&p->b, &p->a);
	pairs[npairs++] = p;
	for (i = 0; i < MAX_QPS && seen[i].qp; i++)
		;
	if (i < MAX_QPS)
		seen[i].qp = p->a.qp;
	return p;
}

static void rings_of(struct end *e, struct metaroce_dv_qp_rings *r)
{
	int ret;

	memset(r, 0, sizeof(*r));
	ret = metaroce_dv_qp_rings(e->qp, r);
	if (ret)
		die("metaroce_dv_qp_rings: %s", strerror(ret));
	if (!r->sq.buf || !r->rq.buf || r->sq.entry_size != sizeof(struct metaroce_dv_send_wqe) ||
	    r->rq.entry_size != sizeof(struct metaroce_dv_recv_wqe) || !r->sq.num_entries ||
	    (r->sq.num_entries & (r->sq.num_entries - 1)))
		die("metaroce_dv_qp_rings gave sq %p/%u/%u rq %p/%u/%u", r->sq.buf,
		    r->sq.entry_size, r->sq.num_entries, r->rq.buf, r->rq.entry_size,
		    r->rq.num_entries);
}

static void *slot(const struct metaroce_dv_ring *r, uint32_t index)
{
	return (char *)r->buf + (size_t)(index & (r->num_entries - 1)) * r->entry_size;
}

static uint32_t load_index(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void store_index(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static void doorbell(struct end *e)
{
	int ret = metaroce_dv_qp_doorbell(e->qp);

	if (ret)
		die("metaroce_dv_qp_doorbell: %s", strerror(ret));
}

/* A valid signaled RDMA WRITE of len bytes from e's buffer to peer's, as the provider writes it. */
static struct metaroce_dv_send_wqe write_wqe(const struct end *e, const struct end *peer,
					     uint64_t wr_id, uint32_t len)
{
	struct metaroce_dv_send_wqe w;

	memset(&w, 0, sizeof(w));
	w.wr_id = wr_id;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.send_flags = IBV_SEND_SIGNALED;
	w.num_sge = 1;
	w.remote_addr = (uintptr_t)peer->buf;
	w.rkey = peer->mr->rkey;
	w.data.sge[0] = (struct metaroce_dv_sge){
		.addr = (uintptr_t)e->buf, .length = len, .lkey = e->mr->lkey,
	};
	return w;
}

/* Whether an async event is about a port or the device rather than a QP, SRQ or CQ. */
static int port_event(enum ibv_event_type t)
{
	switch (t) {
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		return 1;
	default:
		return 0;
	}
}

/* Reads and acknowledges the async events of d; returns whether one of type `want` for qp came. */
static int drain_events(struct dev *d, struct ibv_qp *want_qp, enum ibv_event_type want, double wait_s)
{
	double deadline = now() + wait_s;
	struct ibv_async_event ev;
	struct pollfd pfd = { .fd = d->ctx->async_fd, .events = POLLIN };
	int found = 0, i;

	for (;;) {
		while (ibv_get_async_event(d->ctx, &ev) == 0) {
			if (port_event(ev.event_type)) {
				/* The device's, not a QP's: a port may come up after the test starts. */
				printf("# async event %s on %s (a port's, not counted)\n",
				       ibv_event_type_str(ev.event_type), d->name);
				ibv_ack_async_event(&ev);
				continue;
			}
			for (i = 0; i < MAX_QPS && seen[i].qp; i++) {
				if (seen[i].qp != ev.element.qp)
					continue;
				if (ev.event_type == IBV_EVENT_QP_FATAL)
					seen[i].fatal++;
				else
					seen[i].other++;
				break;
			}
			if (i == MAX_QPS || !seen[i].qp) {
				other_events++;
				printf("# unexpected async event %s on %s\n",
				       ibv_event_type_str(ev.event_type), d->name);
			}
			if (ev.element.qp == want_qp && ev.event_type == want)
				found = 1;
			ibv_ack_async_event(&ev);
		}
		if (found || now() >= deadline)
			return found;
		poll(&pfd, 1, 50);
	}
}

static int fatal_count(struct ibv_qp *qp)
{
	int i;

	for (i = 0; i < MAX_QPS && seen[i].qp; i++)
		if (seen[i].qp == qp)
			return seen[i].fatal;
	return -1;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init))
		return (enum ibv_qp_state)-1;
	return attr.qp_state;
}

/* Polls up to max completions from cq within wait_s (stops early once max came). */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int max, double wait_s)
{
	double deadline = now() + wait_s;
	int n = 0, r;

	while (n < max) {
		r = ibv_poll_cq(cq, max - n, wc + n);
		if (r < 0)
			return r;
		n += r;
		if (n < max) {
			if (now() >= deadline)
				break;
			usleep(1000);
		}
	}
	return n;
}

/*
 * The attacked QP's fate: QP_FATAL delivered, IBV_QPS_ERR, and exactly the WQEs wr_ids[]
 * flushed (IBV_WC_WR_FLUSH_ERR, in order; opcode `recv` for receives), nothing more.
 */
static void check_failed(struct pair *p, const char *name, const uint64_t *wr_ids, int n, int recv)
{
	char what[64];
	struct ibv_wc wc[16];
	enum ibv_qp_state state;
	int got, i, ok;

	snprintf(what, sizeof(what), "%s_event", name);
	result(drain_events(p->a.dev, p->a.qp, IBV_EVENT_QP_FATAL, timeout_s), what,
	       "no IBV_EVENT_QP_FATAL for the QP within %d s", timeout_s);
	snprintf(what, sizeof(what), "%s_state", name);
	state = qp_state(p->a.qp);
	result(state == IBV_QPS_ERR, what, "ibv_query_qp: state %d, want IBV_QPS_ERR (%d)", state,
	       IBV_QPS_ERR);
	if (n < 0)
		return;
	snprintf(what, sizeof(what), "%s_flush", name);
	got = poll_for(p->a.cq, wc, n, timeout_s);
	/* Nothing else comes after them. */
	if (got == n)
		got += poll_for(p->a.cq, wc + n, 16 - n, 0.5);
	ok = got == n;
	for (i = 0; ok && i < n; i++)
		ok = wc[i].status == IBV_WC_WR_FLUSH_ERR && wc[i].wr_id == wr_ids[i] &&
		     wc[i].qp_num == p->a.qp->qp_num && (!recv || wc[i].opcode == IBV_WC_RECV);
	if (ok) {
		result(1, what, " ");
		return;
	}
	result(0, what, "%d completions, want %d flushed:", got, n);
	for (i = 0; i < got; i++)
		printf("#   wr_id 0x%" PRIx64 " status %s opcode %d (want wr_id 0x%" PRIx64 ")\n",
		       wc[i].wr_id, ibv_wc_status_str(wc[i].status), wc[i].opcode,
		       i < n ? wr_ids[i] : 0);
}

/* A hardware counter of port 1 (the whole device), -1 if it cannot be read. */
static long long read_counter(const char *dev, const char *name)
{
	char path[256];
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/%s", dev, name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%lld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static int all_zero(const uint8_t *b, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (b[i])
			return 0;
	return 1;
}

static void case_sq_garbage(struct pair *p)
{
	struct metaroce_dv_qp_rings r;
	struct metaroce_dv_send_wqe garbage, w;
	uint64_t ids[4];
	uint32_t prod;
	int i;

	rings_of(&p->a, &r);
	prod = load_index(r.sq.producer);
	random_bytes(&garbage, sizeof(garbage));
	if (garbage.opcode <= IBV_WR_ATOMIC_FETCH_AND_ADD)
		garbage.opcode |= 0x80000000u; /* never a valid opcode, however random */
	memcpy(slot(&r.sq, prod), &garbage, sizeof(garbage));
	ids[0] = garbage.wr_id;
	for (i = 1; i < 4; i++) {
		ids[i] = 0x1000 + i;
		w = write_wqe(&p->a, &p->b, ids[i], 4096);
		memcpy(slot(&r.sq, prod + i), &w, sizeof(w));
	}
	store_index(r.sq.producer, prod + 4);
	doorbell(&p->a);
	check_failed(p, "sq_garbage", ids, 4, 0);
}

static void case_sq_overflow(struct pair *p)
{
	struct metaroce_dv_qp_rings r;
	struct metaroce_dv_send_wqe w;
	struct ibv_wc wc[4];
	uint64_t ids[2] = { 0x2001, 0x2002 };
	uint32_t prod, cons;
	int i, n;

	rings_of(&p->a, &r);
	prod = load_index(r.sq.producer);
	cons = load_index(r.sq.consumer);
	memset(p->a.buf, 0x5a, 4096);
	for (i = 0; i < 2; i++) {
		w = write_wqe(&p->a, &p->b, ids[i], 4096);
		memcpy(slot(&r.sq, prod + i), &w, sizeof(w));
	}
	store_index(r.sq.producer, prod + (1u << 30));
	doorbell(&p->a);
	check_failed(p, "sq_overflow", NULL, -1, 0);
	n = poll_for(p->a.cq, wc, 4, 1.0);
	result(n == 0 && load_index(r.sq.consumer) == cons && all_zero(p->b.buf, 4096),
	       "sq_overflow_nothing_taken",
	       "%d completions, consumer index %u (was %u), peer buffer %s", n,
	       load_index(r.sq.consumer), cons, all_zero(p->b.buf, 4096) ? "untouched" : "written");
	/* Back in range: the next doorbell flushes what it covers. */
	store_index(r.sq.producer, prod + 2);
	doorbell(&p->a);
	n = poll_for(p->a.cq, wc, 2, timeout_s);
	if (n == 2)
		n += poll_for(p->a.cq, wc + 2, 2, 0.5);
	result(n == 2 && wc[0].wr_id == ids[0] && wc[1].wr_id == ids[1] &&
		       wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[1].status == IBV_WC_WR_FLUSH_ERR,
	       "sq_overflow_flush", "%d completions (first wr_id 0x%" PRIx64 " %s), want 2 flushed",
	       n, n > 0 ? wc[0].wr_id : 0, n > 0 ? ibv_wc_status_str(wc[0].status) : "-");
	result(all_zero(p->b.buf, 4096), "sq_overflow_peer_untouched",
	       "the peer's buffer was written");
}

static void post_recv(struct end *e, uint64_t wr_id, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf, .length = len, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret = ibv_post_recv(e->qp, &wr, &bad);

	if (ret)
		die("ibv_post_recv on %s: %s", e->dev->name, strerror(ret));
}

static int post_send_msg(struct end *e, uint64_t wr_id, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf, .length = len, .lkey = e->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	return ibv_post_send(e->qp, &wr, &bad);
}

static void case_rq_overflow(struct pair *p)
{
	struct metaroce_dv_qp_rings r;
	uint64_t ids[2] = { 0x3001, 0x3002 };
	double deadline;
	uint32_t prod;

	rings_of(&p->a, &r);
	post_recv(&p->a, ids[0], 4096);
	post_recv(&p->a, ids[1], 4096);
	/* A doorbell makes the kernel take them into the transport (its consumer index moves). */
	doorbell(&p->a);
	prod = load_index(r.rq.producer);
	deadline = now() + timeout_s;
	while (load_index(r.rq.consumer) != prod && now() < deadline)
		usleep(1000);
	result(load_index(r.rq.consumer) == prod, "rq_overflow_taken",
	       "RQ consumer index %u, producer %u", load_index(r.rq.consumer), prod);
	store_index(r.rq.producer, prod + (1u << 31));
	doorbell(&p->a);
	check_failed(p, "rq_overflow", ids, 2, 1);
}

static void case_rq_garbage(struct pair *p)
{
	struct metaroce_dv_qp_rings r;
	struct metaroce_dv_recv_wqe garbage, w;
	struct ibv_wc wc[4];
	uint64_t ids[2];
	uint32_t prod;
	int n;

	rings_of(&p->a, &r);
	prod = load_index(r.rq.producer);
	random_bytes(&garbage, sizeof(garbage));
	garbage.num_sge |= 0x100; /* more SGEs than the entry holds, however random */
	memcpy(slot(&r.rq, prod), &garbage, sizeof(garbage));
	memset(&w, 0, sizeof(w));
	w.wr_id = 0x4001;
	w.num_sge = 1;
	w.sge[0] = (struct metaroce_dv_sge){
		.addr = (uintptr_t)p->a.buf, .length = 4096, .lkey = p->a.mr->lkey,
	};
	memcpy(slot(&r.rq, prod + 1), &w, sizeof(w));
	store_index(r.rq.producer, prod + 2);
	ids[0] = garbage.wr_id;
	ids[1] = w.wr_id;
	/* No doorbell: the peer's SEND makes the kernel look. */
	memset(p->b.buf, 0x77, 256);
	if (post_send_msg(&p->b, 0x4100, 256))
		die("ibv_post_send on %s", p->b.dev->name);
	check_failed(p, "rq_garbage", ids, 2, 1);
	result(all_zero(p->a.buf, 4096), "rq_garbage_nothing_placed",
	       "data was placed in the receiver's buffer");
	n = poll_for(p->b.cq, wc, 1, timeout_s);
	result(n == 0 || wc[0].status != IBV_WC_SUCCESS, "rq_garbage_sender",
	       "the peer's SEND completed successfully");
	if (n)
		printf("# the peer's SEND completed with %s\n", ibv_wc_status_str(wc[0].status));
}

/* One RDMA WRITE of `len` bytes and one SEND of 256 from a to b, verified; 0 if all went right. */
static void case_long_list(struct pair *p)
{
	static const uint64_t ids[3] = { 0x3001, 0x3002, 0x3003 };
	static const enum ibv_wc_status want[3] = {
		IBV_WC_SUCCESS, IBV_WC_LOC_QP_OP_ERR, IBV_WC_WR_FLUSH_ERR,
	};
	struct metaroce_dv_qp_rings r;
	struct metaroce_dv_send_wqe w;
	struct ibv_wc wc[4];
	enum ibv_qp_state state;
	uint32_t prod;
	int i, got, ok;

	rings_of(&p->a, &r);
	prod = load_index(r.sq.producer);
	for (i = 0; i < 3; i++) {
		w = write_wqe(&p->a, &p->b, ids[i], 4096);
		if (i == 1) {
			int k;

			w.num_sge = 6;
			for (k = 0; k < 6; k++)
				w.data.sge[k] = (struct metaroce_dv_sge){
					.addr = (uintptr_t)p->a.buf + 128 * k, .length = 64,
					.lkey = p->a.mr->lkey,
				};
		}
		memcpy(slot(&r.sq, prod + i), &w, sizeof(w));
	}
	store_index(r.sq.producer, prod + 3);
	doorbell(&p->a);
	got = poll_for(p->a.cq, wc, 3, timeout_s);
	if (got == 3)
		got += poll_for(p->a.cq, wc + 3, 1, 0.5);
	ok = got == 3;
	for (i = 0; ok && i < 3; i++)
		ok = wc[i].wr_id == ids[i] && wc[i].status == want[i];
	result(ok, "long_list_completions", "%d completions, want 3 (success, LOC_QP_OP_ERR, flush)",
	       got);
	for (i = 0; !ok && i < got; i++)
		printf("#   wr_id 0x%" PRIx64 " status %s\n", wc[i].wr_id,
		       ibv_wc_status_str(wc[i].status));
	state = qp_state(p->a.qp);
	result(state == IBV_QPS_ERR, "long_list_state", "ibv_query_qp: state %d, want IBV_QPS_ERR",
	       state);
}

static int moves_data(struct pair *p, const char *name, uint32_t len, int iter)
{
	struct ibv_sge sge = { .addr = (uintptr_t)p->a.buf, .length = len, .lkey = p->a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 0x9000 + iter, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)p->b.buf, .rkey = p->b.mr->rkey },
	}, *bad;
	struct ibv_wc wc[2];
	uint32_t i;
	int n, ret;

	for (i = 0; i < len; i++)
		p->a.buf[i] = (uint8_t)(i * 131 + (i >> 10) + iter * 7 + 1);
	memset(p->b.buf, 0, BUF_SIZE);
	ret = ibv_post_send(p->a.qp, &wr, &bad);
	if (ret) {
		printf("# %s: ibv_post_send: %s\n", name, strerror(ret));
		return 1;
	}
	n = poll_for(p->a.cq, wc, 1, timeout_s);
	if (n != 1 || wc[0].status != IBV_WC_SUCCESS || wc[0].wr_id != wr.wr_id) {
		printf("# %s: write: %d completions, status %s\n", name, n,
		       n ? ibv_wc_status_str(wc[0].status) : "-");
		return 1;
	}
	if (memcmp(p->a.buf, p->b.buf, len)) {
		printf("# %s: the written data differs\n", name);
		return 1;
	}
	/* A SEND into a receive posted through the verbs. */
	post_recv(&p->b, 0x9100 + iter, 4096);
	memset(p->b.buf, 0, 4096);
	if (post_send_msg(&p->a, 0x9200 + iter, 256)) {
		printf("# %s: ibv_post_send of the SEND failed\n", name);
		return 1;
	}
	n = poll_for(p->a.cq, wc, 1, timeout_s);
	if (n != 1 || wc[0].status != IBV_WC_SUCCESS) {
		printf("# %s: send: %d completions, status %s\n", name, n,
		       n ? ibv_wc_status_str(wc[0].status) : "-");
		return 1;
	}
	n = poll_for(p->b.cq, wc, 1, timeout_s);
	if (n != 1 || wc[0].status != IBV_WC_SUCCESS || wc[0].opcode != IBV_WC_RECV ||
	    wc[0].byte_len != 256 || memcmp(p->a.buf, p->b.buf, 256)) {
		printf("# %s: receive: %d completions, status %s, %u bytes\n", name, n,
		       n ? ibv_wc_status_str(wc[0].status) : "-", n ? wc[0].byte_len : 0);
		return 1;
	}
	return 0;
}

static void case_storm(struct pair *hostile, struct pair *calm, struct pair *failed)
{
	struct metaroce_dv_qp_rings r;
	uint8_t junk[sizeof(struct metaroce_dv_send_wqe)];
	enum ibv_qp_state state;
	int bad_db = 0, ret;
	long i;

	/* Random indices and entries, a doorbell each: one failure, and quiet after it. */
	rings_of(&hostile->a, &r);
	for (i = 0; i < storm; i++) {
		random_bytes(junk, sizeof(junk));
		memcpy(slot(&r.sq, (uint32_t)next_random()), junk, sizeof(junk));
		store_index(r.sq.producer, (uint32_t)next_random());
		if (i % 3 == 0)
			store_index(r.rq.producer, (uint32_t)next_random());
		ret = metaroce_dv_qp_doorbell(hostile->a.qp);
		bad_db += ret != 0;
	}
	result(bad_db == 0, "storm_doorbells", "%d of %ld doorbells failed", bad_db, storm);
	check_failed(hostile, "storm", NULL, -1, 0);

	/* Empty doorbells on a well-behaved QP: nothing happens, and it still moves data. */
	bad_db = 0;
	for (i = 0; i < storm; i++)
		bad_db += metaroce_dv_qp_doorbell(calm->a.qp) != 0;
	state = qp_state(calm->a.qp);
	result(bad_db == 0 && state == IBV_QPS_RTS, "storm_calm_qp",
	       "%d of %ld doorbells failed, state %d (want RTS)", bad_db, storm, state);
	result(moves_data(calm, "storm_calm_data", BUF_SIZE, 1) == 0, "storm_calm_data",
	       "the well-behaved QP does not move data after the storm (see above)");

	/* Doorbells on a QP in the error state: nothing more (no second event: checked last). */
	bad_db = 0;
	for (i = 0; i < storm; i++)
		bad_db += metaroce_dv_qp_doorbell(failed->a.qp) != 0;
	state = qp_state(failed->a.qp);
	result(bad_db == 0 && state == IBV_QPS_ERR, "storm_failed_qp",
	       "%d of %ld doorbells failed, state %d (want ERR)", bad_db, storm, state);
}

/* The QP is destroyed while the kernel may be failing it (a broken RQ, a SEND arriving). */
static void case_destroy(struct pair *p)
{
	struct metaroce_dv_qp_rings r;
	int ret;

	rings_of(&p->a, &r);
	store_index(r.rq.producer, load_index(r.rq.producer) + (1u << 30));
	if (post_send_msg(&p->b, 0x5100, 256))
		die("ibv_post_send on %s", p->b.dev->name);
	ret = ibv_destroy_qp(p->a.qp);
	result(ret == 0, "destroy_while_failing", "ibv_destroy_qp: %s", strerror(ret));
	p->destroyed = 1;
	/* Its address may come back for a new QP: its events are not that one's. */
	for (int i = 0; i < MAX_QPS && seen[i].qp; i++)
		if (seen[i].qp == p->a.qp)
			seen[i].qp = (struct ibv_qp *)&seen[i];
}

static void destroy_all(void)
{
	int i, bad = 0, ret;

	for (i = 0; i < npairs; i++) {
		struct pair *p = pairs[i];
		struct end *ends[2] = { &p->a, &p->b };
		int k;

		for (k = 0; k < 2; k++) {
			struct end *e = ends[k];

			if (!(k == 0 && p->destroyed) && (ret = ibv_destroy_qp(e->qp))) {
				printf("# %s: ibv_destroy_qp: %s\n", p->name, strerror(ret));
				bad++;
			}
			if ((ret = ibv_destroy_cq(e->cq)) || (ret = ibv_dereg_mr(e->mr))) {
				printf("# %s: destroy CQ/MR: %s\n", p->name, strerror(ret));
				bad++;
			}
			free(e->buf);
		}
		free(p);
	}
	result(bad == 0, "teardown", "%d objects failed to go", bad);
}

static void usage(void)
{
	fprintf(stderr, "usage: " PROG " [--seed N] [--timeout SEC] [--storm N] DEV1 DEV2\n");
	exit(2);
}

static unsigned long number(const char *arg, unsigned long min, unsigned long max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(arg, &end, 0);
	if (errno || end == arg || *end || v < min || v > max) {
		fprintf(stderr, PROG ": bad number %s (%lu..%lu)\n", arg, min, max);
		usage();
	}
	return v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seed", required_argument, NULL, 's' },
		{ "timeout", required_argument, NULL, 't' },
		{ "storm", required_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	struct pair *garbage, *overflow, *rq_over, *rq_garb, *long_list, *hostile, *calm, *doomed,
		*healthy;
	struct dev d1 = { 0 }, d2 = { 0 };
	struct ibv_device **devs;
	long long errors1, errors2;
	int opt, i, bad_events;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			rng = number(optarg, 1, UINT64_MAX);
			break;
		case 't':
			timeout_s = (int)number(optarg, 1, 3600);
			break;
		case 'n':
			storm = (long)number(optarg, 1, 10000000);
			break;
		default:
			usage();
		}
	}
	if (argc - optind != 2)
		usage();
	d1.name = argv[optind];
	d2.name = argv[optind + 1];
	printf("# seed %" PRIu64 ", storm %ld, timeout %d s\n", rng, storm, timeout_s);

	devs = ibv_get_device_list(NULL);
	if (!devs)
		die("ibv_get_device_list: %s", strerror(errno));
	open_dev(&d1, find_device(devs, d1.name));
	open_dev(&d2, find_device(devs, d2.name));

	errors1 = read_counter(d1.name, "ring_errors");
	errors2 = read_counter(d2.name, "ring_errors");
	garbage = new_pair("sq_garbage", &d1, &d2, 1);
	case_sq_garbage(garbage);
	overflow = new_pair("sq_overflow", &d1, &d2, 1);
	case_sq_overflow(overflow);
	rq_over = new_pair("rq_overflow", &d1, &d2, 1);
	case_rq_overflow(rq_over);
	rq_garb = new_pair("rq_garbage", &d1, &d2, 1);
	case_rq_garbage(rq_garb);
	long_list = new_pair("long_list", &d1, &d2, 0);
	case_long_list(long_list);
	hostile = new_pair("storm", &d1, &d2, 1);
	calm = new_pair("storm_calm", &d1, &d2, 0);
	case_storm(hostile, calm, garbage);
	/* Five QPs of DEV1 failed by a ring error; none of DEV2. */
	result(errors1 >= 0 && read_counter(d1.name, "ring_errors") == errors1 + 5,
	       "ring_errors_counted", "%s ring_errors %lld before, %lld now (want +5)", d1.name,
	       errors1, read_counter(d1.name, "ring_errors"));
	result(errors2 >= 0 && read_counter(d2.name, "ring_errors") == errors2,
	       "ring_errors_peer_unchanged", "%s ring_errors %lld before, %lld now", d2.name,
	       errors2, read_counter(d2.name, "ring_errors"));
	doomed = new_pair("destroy", &d1, &d2, 0);
	case_destroy(doomed);
	healthy = new_pair("healthy", &d1, &d2, 0);
	result(moves_data(healthy, "healthy_pair", BUF_SIZE, 2) == 0, "healthy_pair",
	       "a new pair does not move data (see above)");

	/* Every failed QP got exactly one QP_FATAL, the others none (a second look for late ones). */
	drain_events(&d1, NULL, IBV_EVENT_QP_FATAL, 1.0);
	drain_events(&d2, NULL, IBV_EVENT_QP_FATAL, 0.1);
	bad_events = other_events;
	for (i = 0; i < npairs; i++) {
		struct pair *p = pairs[i];
		int n = fatal_count(p->a.qp);

		if (p->destroyed)
			continue; /* its events went with it */
		if (n != (p->fails ? 1 : 0)) {
			printf("# %s: %d QP_FATAL events, want %d\n", p->name, n, p->fails);
			bad_events++;
		}
	}
	for (i = 0; i < MAX_QPS && seen[i].qp; i++)
		bad_events += seen[i].other;
	result(bad_events == 0, "events_exactly_once",
	       "%d QPs with the wrong number of events, or other events", bad_events);

	destroy_all();
	ibv_dealloc_pd(d1.pd);
	ibv_dealloc_pd(d2.pd);
	ibv_close_device(d1.ctx);
	ibv_close_device(d2.ctx);
	ibv_free_device_list(devs);
	printf("# %d failed\n", failures);
	return failures ? 1 : 0;
}
