// SPDX-License-Identifier: GPL-2.0
/* Networking wrappers for drivers/sys/udp.rs; see glue_net.h. */
#include "glue_net.h"
