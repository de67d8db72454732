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

#endif /* METAROCE_ABI_USER_H */
