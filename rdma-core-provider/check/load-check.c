// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Host check of the built plugin without an RDMA device: dlopen() it the way libibverbs does and
 * inspect what its constructor registered, through the C view of driver.h (so this also
 * cross-checks the Rust structure layouts), then drive alloc_device/alloc_context/uninit_device
 * against the real rdma-core libibverbs.
 *
 * This executable defines verbs_register_driver_34 itself and exports it (-rdynamic); the
 * executable comes first in the global lookup scope, so the plugin's versioned reference
 * verbs_register_driver_34@IBVERBS_PRIVATE_34 binds here instead of in libibverbs.
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

static int failures;
#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "load-check: FAILED: %s (line %d)\n",  \
				#cond, __LINE__);                              \
			failures++;                                            \
		}                                                              \
	} while (0)

int main(int argc, char **argv)
{
	const struct verbs_match_ent *ent;
	struct verbs_sysfs_dev *sysfs;
	struct verbs_device *vdev;
	struct verbs_context *vctx;
	void *handle;
	int fd;

	if (argc != 2) {
		fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
		return 2;
	}
	handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		fprintf(stderr, "load-check: dlopen: %s\n", dlerror());
		return 1;
	}

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
	if (ent) {
		CHECK(ent[0].kind == VERBS_MATCH_DRIVER_ID);
		CHECK(ent[0].u.driver_id == METAROCE_DRIVER_ID);
		CHECK(ent[1].kind == VERBS_MATCH_SENTINEL);
	}

	/* What try_driver() and verbs_open_device() do, minus the kernel. */
	sysfs = calloc(1, sizeof(*sysfs));
	sysfs->abi_ver = METAROCE_UVERBS_ABI_VERSION;
	vdev = registered->alloc_device(sysfs);
	CHECK(vdev != NULL);
	if (!vdev)
		return 1;
	vdev->ops = registered;
	vdev->sysfs = sysfs;
	atomic_init(&vdev->refcount, 1); /* contexts hold and put it */

	/*
	 * /dev/null as the uverbs fd: the GET_CONTEXT ioctl fails with ENOTTY, the write fallback
	 * "succeeds" with an all-zero response, so the provider must refuse abi_version 0 with
	 * EPROTO and clean up (closing the fd and the zero async fd, hence stdin moved away).
	 */
	fd = open("/dev/null", O_RDWR);
	dup2(fd, 0);
	fd = open("/dev/null", O_RDWR);
	errno = 0;
	vctx = registered->alloc_context(&vdev->device, fd, NULL);
	CHECK(vctx == NULL);
	CHECK(errno == EPROTO);
	CHECK(fcntl(fd, F_GETFD) == -1); /* the provider closed it */
	CHECK(atomic_load(&vdev->refcount) == 1); /* the context's hold was dropped */

	registered->uninit_device(vdev);
	free(sysfs);

	if (failures)
		return 1;
	printf("load-check: %s registered \"%s\" (driver id 0x%llx, uverbs ABI %u..%u); alloc_context refuses a bad ABI\n",
	       argv[1], registered->name, (unsigned long long)ent[0].u.driver_id,
	       registered->match_min_abi_version, registered->match_max_abi_version);
	return 0;
}
