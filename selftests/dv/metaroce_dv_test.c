// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * metaroce_dv_test: the metaroce direct verbs (<infiniband/metaroce_dv.h>) against the real
 * module, in one process, between two metaroce devices (visible from every net namespace):
 *
 *   metaroce_dv_test [--planes MASK] [--writes N] [--size BYTES] [--timeout SEC] DEV1 DEV2
 *
 * It opens both devices (metaroce_dv_is_supported must say yes), creates a PD, a CQ, an RC QP
 * and a registered buffer on each, checks that a QP not yet connected reads back
 * connected 0, connects the two QPs to each other (port 1, GID index 0, the IPv4-mapped
 * address), with --planes restricts DEV1's QP to MASK (read back at once), RDMA-writes DEV1's
 * buffer into DEV2's N times (new data each time, verified), then reads DEV1's QP back with
 * room for METAROCE_DV_MAX_PATHS paths and prints (masks in hex):
 *
 *   connected <c> planes <n> planes_up <mask> num_paths <n> qps <n> plane_mask <mask>
 *   path <id> plane <p> state <s> sport <port> srtt_us <..> cwnd <..> inflight <..> sent <..>
 *        retx <..> ecn <..> timeouts <..>                       (one line per path)
 *   plane <k> sent <packets>                                    (per plane, summed over its paths)
 *
 * It also checks that the direct verbs refuse NULL and a QP of no metaroce device (a QP of
 * another provider's device too, if one is present). Exit status 0 if every check passed, 1
 * with a message on stderr otherwise, 2 for bad arguments. Defaults: 4 writes of 1 MiB,
 * 60 s per completion.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/metaroce_dv.h>
#include <infiniband/verbs.h>

#define PROG "metaroce_dv_test"

struct side {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	union ibv_gid gid;
	int gid_index;
};

static size_t buf_size = 1 << 20;
static long num_writes = 4;
static int timeout_s = 60;

static void __attribute__((noreturn, format(printf, 1, 2))) fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

/* For the verbs that return an errno value (the direct verbs, modify, post, destroy). */
static void check_ret(int ret, const char *what, const char *dev)
{
	if (ret)
		fail("%s on %s: %s (%d)", what, dev, strerror(ret), ret);
}

static struct ibv_device *find_device(struct ibv_device **list, const char *name)
{
	for (; *list; list++)
		if (!strcmp(ibv_get_device_name(*list), name))
			return *list;
	fail("no RDMA device %s", name);
}

static void setup(struct side *s, struct ibv_device *dev)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	if (!metaroce_dv_is_supported(dev))
		fail("%s: metaroce_dv_is_supported says no", s->name);
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		fail("ibv_open_device %s: %s", s->name, strerror(errno));
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = s->pd ? ibv_create_cq(s->ctx, 32, NULL, NULL, 0) : NULL;
	if (!s->cq)
		fail("PD/CQ on %s: %s", s->name, strerror(errno));
	init.send_cq = init.recv_cq = s->cq;
	s->qp = ibv_create_qp(s->pd, &init);
	if (!s->qp)
		fail("ibv_create_qp on %s: %s", s->name, strerror(errno));
	if (posix_memalign((void **)&s->buf, 4096, buf_size))
		fail("no memory for %zu bytes", buf_size);
	memset(s->buf, 0, buf_size);
	s->mr = ibv_reg_mr(s->pd, s->buf, buf_size,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr)
		fail("ibv_reg_mr on %s: %s", s->name, strerror(errno));
	/* The IPv4-mapped GID (::ffff:a.b.c.d): the data path has IPv4 peers only. */
	for (s->gid_index = 0; s->gid_index < 16; s->gid_index++) {
		if (ibv_query_gid(s->ctx, 1, s->gid_index, &s->gid))
			continue;
		if (!s->gid.global.subnet_prefix &&
		    (be64toh(s->gid.global.interface_id) >> 32) == 0xffff)
			return;
	}
	fail("%s: no IPv4-mapped GID on port 1", s->name);
}

/* RESET -> INIT -> RTR -> RTS towards peer, with the usual pingpong values. */
static void connect_qp(struct side *s, const struct side *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	check_ret(ibv_modify_qp(s->qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
		  "modify_qp to INIT", s->name);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = s->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	check_ret(ibv_modify_qp(s->qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					IBV_QP_MIN_RNR_TIMER),
		  "modify_qp to RTR", s->name);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	check_ret(ibv_modify_qp(s->qp, &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
		  "modify_qp to RTS", s->name);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One RDMA WRITE of the whole buffer from src to dst, waited for and verified. */
static void write_and_verify(struct side *src, struct side *dst, long iter)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)src->buf, .length = (uint32_t)buf_size, .lkey = src->mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = (uint64_t)iter, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)dst->buf, .rkey = dst->mr->rkey },
	}, *bad;
	double deadline = now() + timeout_s;
	struct ibv_wc wc;
	size_t i;
	int n;

	for (i = 0; i < buf_size; i++)
		src->buf[i] = (uint8_t)(i * 131 + (i >> 10) + iter * 7 + 1);
	check_ret(ibv_post_send(src->qp, &wr, &bad), "ibv_post_send", src->name);
	while ((n = ibv_poll_cq(src->cq, 1, &wc)) == 0) {
		if (now() > deadline)
			fail("write %ld: no completion on %s within %d s", iter, src->name, timeout_s);
		usleep(100);
	}
	if (n < 0)
		fail("ibv_poll_cq on %s failed", src->name);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)iter ||
	    wc.opcode != IBV_WC_RDMA_WRITE)
		fail("write %ld: completion %s (status %d), wr_id %" PRIu64 ", opcode %d", iter,
		     ibv_wc_status_str(wc.status), wc.status, wc.wr_id, wc.opcode);
	if (memcmp(src->buf, dst->buf, buf_size)) {
		for (i = 0; src->buf[i] == dst->buf[i]; i++)
			;
		fail("write %ld: %s's buffer differs from %s's at byte %zu", iter, dst->name,
		     src->name, i);
	}
}

static void query(const struct side *s, struct metaroce_dv_qp_info *info,
		  struct metaroce_dv_path *paths, uint32_t capacity)
{
	memset(info, 0, sizeof(*info));
	info->num_path_entries = capacity;
	info->paths = paths;
	check_ret(metaroce_dv_query_qp(s->qp, info), "metaroce_dv_query_qp", s->name);
	if (info->num_path_entries > capacity || info->num_path_entries > info->num_paths)
		fail("%s: %u path entries for room %u and %u paths", s->name,
		     info->num_path_entries, capacity, info->num_paths);
}

/* The direct verbs refuse what is not a metaroce QP; devs is the device list. */
static void check_refusals(struct ibv_device **devs)
{
	struct metaroce_dv_qp_info info = { 0 };
	struct ibv_qp orphan = { 0 };	/* a QP of no device at all */
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp = NULL;

	if (metaroce_dv_is_supported(NULL))
		fail("metaroce_dv_is_supported(NULL) says yes");
	if (metaroce_dv_set_qp_planes(NULL, 1) != EINVAL || metaroce_dv_query_qp(NULL, &info) != EINVAL)
		fail("the direct verbs accept a NULL QP");
	if (metaroce_dv_set_qp_planes(&orphan, 1) != EOPNOTSUPP ||
	    metaroce_dv_query_qp(&orphan, &info) != EOPNOTSUPP)
		fail("the direct verbs accept a QP of no device");

	/* Another provider's device, if there is one (rxe, ...): its QPs are not ours either. */
	for (; *devs && metaroce_dv_is_supported(*devs); devs++)
		;
	if (!*devs) {
		printf("# no other provider's device: refusal checked on a QP of no device only\n");
		return;
	}
	if ((ctx = ibv_open_device(*devs)) && (pd = ibv_alloc_pd(ctx)) &&
	    (cq = ibv_create_cq(ctx, 4, NULL, NULL, 0))) {
		init.send_cq = init.recv_cq = cq;
		qp = ibv_create_qp(pd, &init);
	}
	if (qp) {
		if (metaroce_dv_set_qp_planes(qp, 1) != EOPNOTSUPP ||
		    metaroce_dv_query_qp(qp, &info) != EOPNOTSUPP)
			fail("the direct verbs accept a QP of %s", ibv_get_device_name(*devs));
		ibv_destroy_qp(qp);
	} else {
		printf("# no QP on %s (%s): refusal checked on a QP of no device only\n",
		       ibv_get_device_name(*devs), strerror(errno));
	}
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
}

static void usage(void)
{
	fprintf(stderr, "usage: " PROG " [--planes MASK] [--writes N] [--size BYTES] "
			"[--timeout SEC] DEV1 DEV2\n");
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
		{ "planes", required_argument, NULL, 'p' },
		{ "writes", required_argument, NULL, 'n' },
		{ "size", required_argument, NULL, 's' },
		{ "timeout", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	static struct metaroce_dv_path paths[METAROCE_DV_MAX_PATHS];
	uint64_t plane_sent[256] = { 0 };
	struct metaroce_dv_qp_info info;
	struct side a = { 0 }, b = { 0 }, *sides[2] = { &a, &b };
	struct ibv_device **devs;
	uint32_t planes = 0, i, nplanes;
	int set_planes = 0, opt;
	long iter;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'p':
			planes = (uint32_t)number(optarg, 0, UINT32_MAX);
			set_planes = 1;
			break;
		case 'n':
			num_writes = (long)number(optarg, 1, 1000000);
			break;
		case 's':
			buf_size = number(optarg, 1, 1ul << 30);
			break;
		case 't':
			timeout_s = (int)number(optarg, 1, 86400);
			break;
		default:
			usage();
		}
	}
	if (argc - optind != 2)
		usage();
	a.name = argv[optind];
	b.name = argv[optind + 1];

	devs = ibv_get_device_list(NULL);
	if (!devs)
		fail("ibv_get_device_list: %s", strerror(errno));
	check_refusals(devs);
	setup(&a, find_device(devs, a.name));
	setup(&b, find_device(devs, b.name));

	/* Not connected yet: nothing but connected 0 (and no restriction). */
	for (i = 0; i < 2; i++) {
		query(sides[i], &info, paths, METAROCE_DV_MAX_PATHS);
		if (info.connected || info.num_path_entries || info.plane_mask)
			fail("%s: a new QP reads back connected %u, %u paths, plane_mask 0x%x",
			     sides[i]->name, info.connected, info.num_path_entries, info.plane_mask);
	}

	connect_qp(&a, &b);
	connect_qp(&b, &a);
	if (set_planes) {
		check_ret(metaroce_dv_set_qp_planes(a.qp, planes), "metaroce_dv_set_qp_planes", a.name);
		query(&a, &info, NULL, 0);
		if (info.plane_mask != planes)
			fail("%s: plane_mask 0x%x read back after setting 0x%x", a.name,
			     info.plane_mask, planes);
	}

	for (iter = 0; iter < num_writes; iter++)
		write_and_verify(&a, &b, iter);

	query(&b, &info, NULL, 0);
	if (info.connected != 1)
		fail("%s: connected %u after the writes", b.name, info.connected);
	query(&a, &info, paths, METAROCE_DV_MAX_PATHS);
	if (info.connected != 1 || info.plane_mask != planes)
		fail("%s: connected %u, plane_mask 0x%x after the writes (want 1, 0x%x)", a.name,
		     info.connected, info.plane_mask, planes);
	if (info.num_path_entries != info.num_paths && info.num_paths <= METAROCE_DV_MAX_PATHS)
		fail("%s: %u of %u paths read back", a.name, info.num_path_entries, info.num_paths);
	printf("connected %u planes %u planes_up 0x%x num_paths %u qps %u plane_mask 0x%x\n",
	       info.connected, info.planes, info.planes_up, info.num_paths, info.qps,
	       info.plane_mask);
	nplanes = info.planes;
	for (i = 0; i < info.num_path_entries; i++) {
		const struct metaroce_dv_path *p = &paths[i];

		printf("path %u plane %u state %u sport %u srtt_us %u cwnd %u inflight %u sent %" PRIu64
		       " retx %" PRIu64 " ecn %" PRIu64 " timeouts %" PRIu64 "\n",
		       p->path_id, p->plane, p->state, p->udp_sport, p->srtt_us, p->cwnd,
		       p->in_flight, p->packets_sent, p->retransmits, p->ecn_marks, p->timeouts);
		plane_sent[p->plane] += p->packets_sent;
		if (p->plane >= nplanes)
			nplanes = p->plane + 1u;
	}
	for (i = 0; i < nplanes && i < 256; i++)
		printf("plane %u sent %" PRIu64 "\n", i, plane_sent[i]);

	for (i = 0; i < 2; i++) {
		struct side *s = sides[i];

		check_ret(ibv_destroy_qp(s->qp), "ibv_destroy_qp", s->name);
		check_ret(ibv_destroy_cq(s->cq), "ibv_destroy_cq", s->name);
		check_ret(ibv_dereg_mr(s->mr), "ibv_dereg_mr", s->name);
		check_ret(ibv_dealloc_pd(s->pd), "ibv_dealloc_pd", s->name);
		if (ibv_close_device(s->ctx))
			fail("ibv_close_device %s: %s", s->name, strerror(errno));
		free(s->buf);
	}
	ibv_free_device_list(devs);
	return 0;
}
