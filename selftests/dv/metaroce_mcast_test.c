// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * metaroce_mcast_test: multicast for UD QPs through the plain verbs (ibv_attach_mcast,
 * ibv_detach_mcast, a UD send to QP 0xFFFFFF at a group's GID) against the real module:
 *
 *   metaroce_mcast_test [--timeout SEC] DEV1 DEV2
 *
 * DEV1 and DEV2 are two metaroce devices on two hosts (namespaces) of one link, each with an
 * IPv4 and a global IPv6 address. A sender S on DEV1, members A and B on DEV2 and C on DEV1
 * (a member on the sender's own host). For an IPv4 group (::ffff:230.77.1.1) and an IPv6 one
 * (ff0e::4d52:1):
 *
 *   attach_<fam>     A, B and C attach (A twice: no error); a unicast GID and a detach of a
 *                    group the QP is not in are EINVAL
 *   deliver_<fam>    S sends 8 datagrams (64 bytes, immediate i) to the group: A, B and C each
 *                    receive all 8, with the data, the immediate, S's QPN, a GRH whose
 *                    network header names the group as destination and an sl that says
 *                    which header it is (1 IPv6, 2 IPv4)
 *   detach_<fam>     after B detaches, 4 more reach A and C and none reaches B
 *
 * then the limits the device reports:
 *
 *   limits_reported  max_mcast_grp, max_mcast_qp_attach > 0, and max_total_mcast_qp_attach
 *                    their product
 *   limit_per_group  max_mcast_qp_attach QPs attach to one group, one more is ENOMEM
 *   limit_groups     one QP attaches to max_mcast_grp groups, one more is ENOMEM; all detach
 *
 * Every result is a line "ok <name>" or "FAIL <name>: <why>"; exit status 0 if all passed, 1
 * if one failed, 2 for bad arguments, 3 if the setup failed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
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

#define PROG "metaroce_mcast_test"
#define QKEY 0x11110000u
#define MC_QPN 0xffffffu
#define MSG 64
#define GRH 40
#define SLOT 256
#define SLOTS 32
#define FIRST 8
#define MORE 4

struct dev {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int gid4, gid6;	/* GID indexes: IPv4-mapped, global IPv6 */
	union ibv_gid unicast;
};

struct ud {
	struct dev *dev;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	int posted;	/* receive slots posted so far (each used once) */
};

static int timeout_s = 20;
static int failures;

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

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void open_dev(struct dev *d, struct ibv_device **list)
{
	union ibv_gid g;
	int i;

	for (; *list; list++)
		if (!strcmp(ibv_get_device_name(*list), d->name))
			break;
	if (!*list)
		die("no RDMA device %s", d->name);
	if (!metaroce_dv_is_supported(*list))
		die("%s is not a metaroce device", d->name);
	d->ctx = ibv_open_device(*list);
	if (!d->ctx)
		die("ibv_open_device %s: %s", d->name, strerror(errno));
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		die("ibv_alloc_pd on %s: %s", d->name, strerror(errno));
	d->gid4 = d->gid6 = -1;
	for (i = 0; i < 16; i++) {
		if (ibv_query_gid(d->ctx, 1, i, &g) || !memcmp(&g, &(union ibv_gid){}, sizeof(g)))
			continue;
		if (!g.global.subnet_prefix && (be64toh(g.global.interface_id) >> 32) == 0xffff) {
			if (d->gid4 < 0) {
				d->gid4 = i;
				d->unicast = g;
			}
		} else if (g.raw[0] != 0xfe && d->gid6 < 0) {
			d->gid6 = i;
		}
	}
	if (d->gid4 < 0 || d->gid6 < 0)
		die("%s: port 1 needs an IPv4-mapped and a global IPv6 GID", d->name);
}

static void make_ud(struct ud *u, struct dev *d, struct ibv_cq *shared)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = SLOTS, .max_recv_wr = SLOTS, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	int ret;

	memset(u, 0, sizeof(*u));
	u->dev = d;
	u->cq = shared ? shared : ibv_create_cq(d->ctx, 2 * SLOTS, NULL, NULL, 0);
	if (!u->cq)
		die("ibv_create_cq on %s: %s", d->name, strerror(errno));
	init.send_cq = init.recv_cq = u->cq;
	u->qp = ibv_create_qp(d->pd, &init);
	if (!u->qp)
		die("ibv_create_qp (UD) on %s: %s", d->name, strerror(errno));
	ret = ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	if (ret)
		die("modify_qp to INIT on %s: %s", d->name, strerror(ret));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	ret = ibv_modify_qp(u->qp, &a, IBV_QP_STATE);
	if (ret)
		die("modify_qp to RTR on %s: %s", d->name, strerror(ret));
	a.qp_state = IBV_QPS_RTS;
	ret = ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	if (ret)
		die("modify_qp to RTS on %s: %s", d->name, strerror(ret));
	if (shared)
		return;
	if (posix_memalign((void **)&u->buf, 4096, SLOT * SLOTS))
		die("no memory");
	memset(u->buf, 0, SLOT * SLOTS);
	u->mr = ibv_reg_mr(d->pd, u->buf, SLOT * SLOTS, IBV_ACCESS_LOCAL_WRITE);
	if (!u->mr)
		die("ibv_reg_mr on %s: %s", d->name, strerror(errno));
}

/* Posts n receive slots (wr_id: the slot). */
static void post_recvs(struct ud *u, int n)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	int i, ret;

	for (i = 0; i < n; i++) {
		if (u->posted == SLOTS)
			die("out of receive slots");
		sge = (struct ibv_sge){
			.addr = (uintptr_t)(u->buf + u->posted * SLOT), .length = SLOT, .lkey = u->mr->lkey,
		};
		wr = (struct ibv_recv_wr){ .wr_id = u->posted, .sg_list = &sge, .num_sge = 1 };
		ret = ibv_post_recv(u->qp, &wr, &bad);
		if (ret)
			die("ibv_post_recv: %s", strerror(ret));
		u->posted++;
	}
}

static void group_gid(union ibv_gid *g, int v6)
{
	memset(g, 0, sizeof(*g));
	if (v6) {
		inet_pton(AF_INET6, "ff0e::4d52:1", g->raw);
	} else {
		g->raw[10] = g->raw[11] = 0xff;
		inet_pton(AF_INET, "230.77.1.1", g->raw + 12);
	}
}

/* S sends n datagrams to group g, immediates first..first+n-1, payload bytes (imm + k). */
static int send_to_group(struct ud *s, const union ibv_gid *g, int v6, int first, int n, char *why,
			 size_t whylen)
{
	struct ibv_ah_attr ah_attr = {
		.is_global = 1,
		.port_num = 1,
		.grh = { .dgid = *g, .sgid_index = v6 ? s->dev->gid6 : s->dev->gid4, .hop_limit = 8 },
	};
	struct ibv_ah *ah = ibv_create_ah(s->dev->pd, &ah_attr);
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct ibv_wc wc;
	double end;
	int i, k, done = 0, ret;

	if (!ah) {
		snprintf(why, whylen, "ibv_create_ah: %s", strerror(errno));
		return 0;
	}
	for (i = 0; i < n; i++) {
		uint8_t *p = s->buf + (i % SLOTS) * SLOT;

		for (k = 0; k < MSG; k++)
			p[k] = (uint8_t)(first + i + k);
		sge = (struct ibv_sge){ .addr = (uintptr_t)p, .length = MSG, .lkey = s->mr->lkey };
		wr = (struct ibv_send_wr){
			.wr_id = first + i, .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
			.imm_data = htobe32(first + i),
		};
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = MC_QPN;
		wr.wr.ud.remote_qkey = QKEY;
		ret = ibv_post_send(s->qp, &wr, &bad);
		if (ret) {
			snprintf(why, whylen, "ibv_post_send: %s", strerror(ret));
			ibv_destroy_ah(ah);
			return 0;
		}
	}
	end = now() + timeout_s;
	while (done < n && now() < end) {
		ret = ibv_poll_cq(s->cq, 1, &wc);
		if (ret < 0)
			break;
		if (!ret) {
			usleep(1000);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			snprintf(why, whylen, "send completion %s", ibv_wc_status_str(wc.status));
			ibv_destroy_ah(ah);
			return 0;
		}
		done++;
	}
	ibv_destroy_ah(ah);
	if (done < n)
		snprintf(why, whylen, "%d of %d sends completed", done, n);
	return done == n;
}

/*
 * Waits up to `wait` seconds for `n` receive completions on u (none if n is 0: then it waits
 * the whole time and fails on any), each checked against what S sent to group g.
 */
static int receive(struct ud *u, const struct ud *s, const union ibv_gid *g, int v6, int first,
		   int n, double wait, char *why, size_t whylen)
{
	uint32_t seen = 0;
	struct ibv_wc wc;
	double end = now() + wait;
	int got = 0, ret, k;

	while (now() < end && (n == 0 || got < n)) {
		ret = ibv_poll_cq(u->cq, 1, &wc);
		if (ret < 0) {
			snprintf(why, whylen, "ibv_poll_cq failed");
			return 0;
		}
		if (!ret) {
			usleep(1000);
			continue;
		}
		if (n == 0) {
			snprintf(why, whylen, "a completion (status %s) after the detach",
				 ibv_wc_status_str(wc.status));
			return 0;
		}
		uint8_t *p = u->buf + wc.wr_id * SLOT;
		int imm = (int)be32toh(wc.imm_data);

		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
			snprintf(why, whylen, "status %s opcode %d", ibv_wc_status_str(wc.status),
				 wc.opcode);
			return 0;
		}
		if (!(wc.wc_flags & IBV_WC_GRH) || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
		    wc.byte_len != GRH + MSG || wc.src_qp != s->qp->qp_num || imm < first ||
		    imm >= first + n || (seen & (1u << (imm - first)))) {
			snprintf(why, whylen,
				 "flags 0x%x byte_len %u src_qp 0x%x (S 0x%x) imm %d (want %d..%d once)",
				 wc.wc_flags, wc.byte_len, wc.src_qp, s->qp->qp_num, imm, first,
				 first + n - 1);
			return 0;
		}
		seen |= 1u << (imm - first);
		for (k = 0; k < MSG; k++)
			if (p[GRH + k] != (uint8_t)(imm + k)) {
				snprintf(why, whylen, "datagram %d: byte %d is %u", imm, k, p[GRH + k]);
				return 0;
			}
		/* The network header's destination: IPv4 (after 20 zero bytes) or IPv6. */
		if (v6 ? memcmp(p + 24, g->raw, 16) : memcmp(p + 20 + 16, g->raw + 12, 4)) {
			snprintf(why, whylen, "datagram %d: the GRH does not name the group", imm);
			return 0;
		}
		/* sl says which (mlx5's L3 header type, 1 IPv6, 2 IPv4): UCX's UD reads it. */
		if (wc.sl != (v6 ? 1 : 2)) {
			snprintf(why, whylen, "datagram %d: sl %u, want %d (%s)", imm, wc.sl,
				 v6 ? 1 : 2, v6 ? "IPv6" : "IPv4");
			return 0;
		}
		got++;
	}
	if (n && got < n) {
		snprintf(why, whylen, "%d of %d datagrams in %.0f s", got, n, wait);
		return 0;
	}
	return 1;
}

static void family(struct ud *s, struct ud *a, struct ud *b, struct ud *c, int v6)
{
	const char *fam = v6 ? "ipv6" : "ipv4";
	union ibv_gid g, other;
	char name[32], why[160] = "";
	int ok, ret;

	group_gid(&g, v6);
	snprintf(name, sizeof(name), "attach_%s", fam);
	ok = 1;
	if ((ret = ibv_attach_mcast(a->qp, &g, 0)) || (ret = ibv_attach_mcast(b->qp, &g, 0)) ||
	    (ret = ibv_attach_mcast(c->qp, &g, 0)) || (ret = ibv_attach_mcast(a->qp, &g, 0))) {
		ok = 0;
		snprintf(why, sizeof(why), "attach: %s", strerror(ret));
	}
	if (ok && (ret = ibv_attach_mcast(a->qp, &a->dev->unicast, 0)) != EINVAL) {
		ok = 0;
		snprintf(why, sizeof(why), "attach to a unicast GID: %s (want EINVAL)", strerror(ret));
	}
	group_gid(&other, v6);
	other.raw[15] ^= 0x40;
	if (ok && (ret = ibv_detach_mcast(a->qp, &other, 0)) != EINVAL) {
		ok = 0;
		snprintf(why, sizeof(why), "detach from a group not attached: %s (want EINVAL)",
			 strerror(ret));
	}
	result(ok, name, "%s", why);
	if (!ok) {
		ibv_detach_mcast(a->qp, &g, 0);
		ibv_detach_mcast(b->qp, &g, 0);
		ibv_detach_mcast(c->qp, &g, 0);
		return;
	}

	snprintf(name, sizeof(name), "deliver_%s", fam);
	post_recvs(a, FIRST);
	post_recvs(b, FIRST);
	post_recvs(c, FIRST);
	ok = send_to_group(s, &g, v6, 0, FIRST, why, sizeof(why));
	if (ok && !receive(a, s, &g, v6, 0, FIRST, timeout_s, why, sizeof(why)))
		ok = 0, strcat(why, " (A on DEV2)");
	if (ok && !receive(b, s, &g, v6, 0, FIRST, timeout_s, why, sizeof(why)))
		ok = 0, strcat(why, " (B on DEV2)");
	if (ok && !receive(c, s, &g, v6, 0, FIRST, timeout_s, why, sizeof(why)))
		ok = 0, strcat(why, " (C on DEV1, the sender's host)");
	result(ok, name, "%s", why);

	snprintf(name, sizeof(name), "detach_%s", fam);
	ok = 1;
	if ((ret = ibv_detach_mcast(b->qp, &g, 0))) {
		ok = 0;
		snprintf(why, sizeof(why), "detach: %s", strerror(ret));
	}
	post_recvs(a, MORE);
	post_recvs(b, MORE);
	post_recvs(c, MORE);
	if (ok)
		ok = send_to_group(s, &g, v6, 100, MORE, why, sizeof(why));
	if (ok && !receive(a, s, &g, v6, 100, MORE, timeout_s, why, sizeof(why)))
		ok = 0, strcat(why, " (A)");
	if (ok && !receive(c, s, &g, v6, 100, MORE, timeout_s, why, sizeof(why)))
		ok = 0, strcat(why, " (C)");
	if (ok && !receive(b, s, &g, v6, 100, 0, 1.0, why, sizeof(why)))
		ok = 0, strcat(why, " (B)");
	/* Whatever happened above, A and C leave (the limits below need every group slot). */
	if (((ret = ibv_detach_mcast(a->qp, &g, 0)) || (ret = ibv_detach_mcast(c->qp, &g, 0))) &&
	    ok) {
		ok = 0;
		snprintf(why, sizeof(why), "detach A or C: %s", strerror(ret));
	}
	if ((ret = ibv_detach_mcast(b->qp, &g, 0)) != EINVAL && ok) {
		ok = 0;
		snprintf(why, sizeof(why), "second detach of B: %s (want EINVAL)", strerror(ret));
	}
	result(ok, name, "%s", why);
}

static void limits(struct dev *d)
{
	struct ibv_device_attr attr;
	union ibv_gid g;
	struct ud *qps;
	struct ibv_cq *cq;
	char why[160] = "";
	int ok, ret, i, n, grp, per;

	if (ibv_query_device(d->ctx, &attr))
		die("ibv_query_device: %s", strerror(errno));
	grp = attr.max_mcast_grp;
	per = attr.max_mcast_qp_attach;
	result(grp > 0 && per > 0 && attr.max_total_mcast_qp_attach == grp * per, "limits_reported",
	       "max_mcast_grp %d max_mcast_qp_attach %d max_total_mcast_qp_attach %d", grp, per,
	       attr.max_total_mcast_qp_attach);
	if (grp <= 0 || per <= 0 || per > 4096 || grp > 65536)
		return;

	cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	qps = calloc(per + 1, sizeof(*qps));
	if (!cq || !qps)
		die("limits: no CQ or memory");
	for (i = 0; i <= per; i++)
		make_ud(&qps[i], d, cq);
	group_gid(&g, 0);
	g.raw[15] = 9;
	ok = 1;
	for (i = 0; i < per && ok; i++)
		if ((ret = ibv_attach_mcast(qps[i].qp, &g, 0))) {
			ok = 0;
			snprintf(why, sizeof(why), "attach %d of %d: %s", i + 1, per, strerror(ret));
		}
	if (ok && (ret = ibv_attach_mcast(qps[per].qp, &g, 0)) != ENOMEM) {
		ok = 0;
		snprintf(why, sizeof(why), "attach %d: %s (want ENOMEM)", per + 1, strerror(ret));
	}
	for (i = 0; i < per; i++)
		ibv_detach_mcast(qps[i].qp, &g, 0);
	result(ok, "limit_per_group", "%s", why);

	ok = 1;
	for (n = 0; n < grp && ok; n++) {
		group_gid(&g, 1);
		g.raw[13] = (uint8_t)(n >> 8);
		g.raw[14] = (uint8_t)n;
		if ((ret = ibv_attach_mcast(qps[0].qp, &g, 0))) {
			ok = 0;
			snprintf(why, sizeof(why), "group %d of %d: %s", n + 1, grp, strerror(ret));
		}
	}
	group_gid(&g, 1);
	g.raw[12] = 0x77;
	if (ok && (ret = ibv_attach_mcast(qps[0].qp, &g, 0)) != ENOMEM) {
		ok = 0;
		snprintf(why, sizeof(why), "group %d: %s (want ENOMEM)", grp + 1, strerror(ret));
	}
	for (i = 0; i < n; i++) {
		group_gid(&g, 1);
		g.raw[13] = (uint8_t)(i >> 8);
		g.raw[14] = (uint8_t)i;
		if ((ret = ibv_detach_mcast(qps[0].qp, &g, 0)) && ok) {
			ok = 0;
			snprintf(why, sizeof(why), "detach of group %d: %s", i + 1, strerror(ret));
		}
	}
	result(ok, "limit_groups", "%s", why);
	for (i = 0; i <= per; i++)
		ibv_destroy_qp(qps[i].qp);
	ibv_destroy_cq(cq);
	free(qps);
}

static void destroy(struct ud *u)
{
	ibv_destroy_qp(u->qp);
	ibv_destroy_cq(u->cq);
	ibv_dereg_mr(u->mr);
	free(u->buf);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	struct dev d1 = {}, d2 = {};
	struct ud s, a, b, c;
	struct ibv_device **list;
	int opt;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (opt == 't') {
			timeout_s = atoi(optarg);
		} else {
			fprintf(stderr, "usage: " PROG " [--timeout SEC] DEV1 DEV2\n");
			return 2;
		}
	}
	if (argc - optind != 2 || timeout_s <= 0) {
		fprintf(stderr, "usage: " PROG " [--timeout SEC] DEV1 DEV2\n");
		return 2;
	}
	d1.name = argv[optind];
	d2.name = argv[optind + 1];
	list = ibv_get_device_list(NULL);
	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	open_dev(&d1, list);
	open_dev(&d2, list);
	make_ud(&s, &d1, NULL);
	make_ud(&a, &d2, NULL);
	make_ud(&b, &d2, NULL);
	make_ud(&c, &d1, NULL);

	family(&s, &a, &b, &c, 0);
	family(&s, &a, &b, &c, 1);
	limits(&d2);

	destroy(&s);
	destroy(&a);
	destroy(&b);
	destroy(&c);
	ibv_dealloc_pd(d1.pd);
	ibv_dealloc_pd(d2.pd);
	ibv_close_device(d1.ctx);
	ibv_close_device(d2.ctx);
	ibv_free_device_list(list);
	return failures ? 1 : 0;
}
