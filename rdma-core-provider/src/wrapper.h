/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Input to bindgen (see build.rs): the rdma-core provider API of the pinned rdma-core
 * (driver.h, kern-abi.h), our ABI header shared with the kernel module, our public direct
 * verbs header (metaroce_dv.h), and the few libc items the FFI layer needs.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/driver.h>
#include <infiniband/kern-abi.h>

#include "metaroce-abi.h"
#include "metaroce_dv.h"

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

/* ibv_cmd_resize_cq()'s: the new ring, described as create_cq's is. */
struct metaroce_cmd_resize_cq_resp {
	struct ib_uverbs_resize_cq_resp ibv_resp;
	struct metaroce_create_cq_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_resize_cq_resp) ==
		       sizeof(struct ib_uverbs_resize_cq_resp) +
			       sizeof(struct metaroce_create_cq_resp),
	       "implicit padding in metaroce_cmd_resize_cq_resp");

/* ibv_cmd_modify_srq()'s command: the core's, then ours (where the new ring is described). */
struct metaroce_cmd_modify_srq {
	struct ibv_modify_srq ibv_cmd;
	struct metaroce_modify_srq_cmd drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_modify_srq) ==
		       sizeof(struct ibv_modify_srq) + sizeof(struct metaroce_modify_srq_cmd),
	       "implicit padding in metaroce_cmd_modify_srq");

/* ibv_cmd_create_cq_ex()'s: the extended core response, then ours (the same driver part). */
struct metaroce_cmd_create_cq_ex_resp {
	struct ib_uverbs_ex_create_cq_resp ibv_resp;
	struct metaroce_create_cq_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_create_cq_ex_resp) ==
		       sizeof(struct ib_uverbs_ex_create_cq_resp) +
			       sizeof(struct metaroce_create_cq_resp),
	       "implicit padding in metaroce_cmd_create_cq_ex_resp");

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

/*
 * The direct verbs' command: the extended modify_qp with our driver part after the core
 * command, and the response with ours after the core response (followed by room for
 * metaroce_path_info entries). What DECLARE_DRV_CMD(metaroce_cmd_modify_qp,
 * IB_USER_VERBS_EX_CMD_MODIFY_QP, metaroce_modify_qp_cmd, metaroce_modify_qp_resp) would declare;
 * the asserts are its own.
 */
struct metaroce_cmd_modify_qp {
	struct ibv_modify_qp_ex ibv_cmd;
	struct metaroce_modify_qp_cmd drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_modify_qp) ==
		       sizeof(struct ibv_modify_qp_ex) + sizeof(struct metaroce_modify_qp_cmd),
	       "implicit padding in metaroce_cmd_modify_qp");
_Static_assert(sizeof(struct ib_uverbs_ex_modify_qp) % __alignof__(struct metaroce_modify_qp_cmd) == 0,
	       "Bad kabi req struct length");

struct metaroce_cmd_modify_qp_resp {
	struct ib_uverbs_ex_modify_qp_resp ibv_resp;
	struct metaroce_modify_qp_resp drv_payload;
};
_Static_assert(sizeof(struct metaroce_cmd_modify_qp_resp) ==
		       sizeof(struct ib_uverbs_ex_modify_qp_resp) +
			       sizeof(struct metaroce_modify_qp_resp),
	       "implicit padding in metaroce_cmd_modify_qp_resp");
/* The _ex write protocol counts driver words of 8 bytes. */
_Static_assert(sizeof(struct metaroce_modify_qp_cmd) % 8 == 0, "driver command not in words");
_Static_assert(sizeof(struct metaroce_modify_qp_resp) % 8 == 0, "driver response not in words");
_Static_assert(sizeof(struct metaroce_path_info) % 8 == 0, "path entry not in words");

/* The public header restates the kernel ABI's path states and entry layout. */
_Static_assert(METAROCE_DV_PATH_ACTIVE == METAROCE_PATH_ACTIVE &&
		       METAROCE_DV_PATH_SUSPECT == METAROCE_PATH_SUSPECT &&
		       METAROCE_DV_PATH_FAILED == METAROCE_PATH_FAILED &&
		       METAROCE_DV_PATH_PROBING == METAROCE_PATH_PROBING,
	       "metaroce_dv_path_state differs from metaroce_path_state");
_Static_assert(sizeof(struct metaroce_dv_path) == sizeof(struct metaroce_path_info),
	       "metaroce_dv_path differs from metaroce_path_info");
