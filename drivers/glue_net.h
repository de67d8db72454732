/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C wrappers for the networking static inlines and macros the UDP transport layer
 * (drivers/sys/udp.rs) calls. As in glue.h: one expression each, no logic.
 */
#ifndef METAROCE_GLUE_NET_H
#define METAROCE_GLUE_NET_H

#include <linux/skbuff.h>
#include <linux/udp.h>
#include <net/udp_tunnel.h>

#endif /* METAROCE_GLUE_NET_H */
