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
 *   legacy write() ABI, which fake_uverbs_write() answers for GET_CONTEXT, QUERY_DEVICE and
 *   QUERY_PORT like the kernel would (the response pointer is the first payload word).
 *
 * Usage: load-check /path/to/libmetaroce-rdmav34.so
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <infiniband/driver.h>

#include "metaroce-abi.h"

static const struct verbs_device_ops *registered;
static int registrations;

void verbs_register_driver(const struct verbs_device_ops *ops)
{
	registered = ops;
	registrations++;
}

/* ---- fake kernel ---- */

static int fake_fd = -1;		/* the cmd_fd handed to alloc_context */
static int fake_async_fd = -1;		/* the async fd GET_CONTEXT "creates" */
static __u32 fake_abi_version;		/* what alloc_ucontext reports */
static int fake_calls[64];

static void fill(const struct ib_uverbs_cmd_hdr *hdr, const void *resp, size_t len)
{
	__u64 response;

	memcpy(&response, hdr + 1, sizeof(response));
	if (len > hdr->out_words * 4u)
		len = hdr->out_words * 4u;
	memcpy((void *)(uintptr_t)response, resp, len);
}

static ssize_t fake_uverbs_write(const void *buf, size_t count)
{
	const struct ib_uverbs_cmd_hdr *hdr = buf;

	if (count < sizeof(*hdr) + 8) {
		errno = EINVAL;
		return -1;
	}
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
	fake_abi_version = abi_version;
	fake_async_fd = -1;
	fake_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	errno = 0;
	return registered->alloc_context(&vdev->device, fake_fd, NULL);
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

	if (argc != 2) {
		fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
		return 2;
	}
	handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		fprintf(stderr, "load-check: dlopen: %s\n", dlerror());
		return 1;
	}

	/* Registration. */
	CHECK(registrations == 1);
	if (!registered) {
		fprintf(stderr, "load-check: the constructor registered nothing\n");
		return 1;
	}
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

	/* Verbs not implemented yet: libibverbs' dummy ops. */
	errno = 0;
	CHECK(ibv_alloc_pd(&vctx->context) == NULL);
	CHECK(errno == EOPNOTSUPP);

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
	       "alloc_context/query_device_ex/query_port/close work against a fake uverbs, "
	       "a wrong ABI is refused\n",
	       argv[1], registered->name, (unsigned long long)ent[0].u.driver_id,
	       registered->match_min_abi_version, registered->match_max_abi_version);
	return 0;
}
