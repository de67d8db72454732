/* SPDX-License-Identifier: GPL-2.0 */
/* What bindgen reads to generate drivers/bindings_generated.rs (see Kbuild). */
#include <linux/netdevice.h>
#include <linux/notifier.h>
#include <net/net_namespace.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_netlink.h>
#include "glue.h"
#include "../uapi/metaroce-abi.h"
