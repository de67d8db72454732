/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Input to bindgen (see build.rs): the rdma-core provider API of the pinned rdma-core
 * (driver.h, kern-abi.h), our ABI header shared with the kernel module, and the few libc
 * items the FFI layer needs.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/driver.h>
#include <infiniband/kern-abi.h>

#include "metaroce-abi.h"

/*
 * The response buffer of ibv_cmd_get_context(): the core uverbs response followed by our
 * driver-specific part (what DECLARE_DRV_CMD() builds for in-tree providers).
 */
struct metaroce_get_context_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct metaroce_alloc_ucontext_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_get_context_resp) ==
		       sizeof(struct ib_uverbs_get_context_resp) +
			       sizeof(struct metaroce_alloc_ucontext_resp),
	       "implicit padding in metaroce_get_context_resp");

/* The same for the verbs whose kernel response carries a driver part. */
struct metaroce_cmd_create_cq_resp {
	struct ib_uverbs_create_cq_resp ibv_resp;
	struct metaroce_create_cq_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_create_cq_resp) ==
		       sizeof(struct ib_uverbs_create_cq_resp) +
			       sizeof(struct metaroce_create_cq_resp),
	       "implicit padding in metaroce_cmd_create_cq_resp");

struct metaroce_cmd_create_qp_resp {
	struct ib_uverbs_create_qp_resp ibv_resp;
	struct metaroce_create_qp_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_create_qp_resp) ==
		       sizeof(struct ib_uverbs_create_qp_resp) +
			       sizeof(struct metaroce_create_qp_resp),
	       "implicit padding in metaroce_cmd_create_qp_resp");

struct metaroce_cmd_create_srq_resp {
	struct ib_uverbs_create_srq_resp ibv_resp;
	struct metaroce_create_srq_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_create_srq_resp) ==
		       sizeof(struct ib_uverbs_create_srq_resp) +
			       sizeof(struct metaroce_create_srq_resp),
	       "implicit padding in metaroce_cmd_create_srq_resp");
