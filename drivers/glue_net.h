/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C wrappers for the networking static inlines and macros the UDP socket layer
 * (drivers/sys/socket.rs) calls. As in glue.h: one expression each, no logic.
 */
#ifndef METAROCE_GLUE_NET_H
#define METAROCE_GLUE_NET_H

#include <linux/skbuff.h>
#include <linux/udp.h>
#include <net/route.h>
#include <net/udp_tunnel.h>

int metaroce_glue_udp_sock_create(struct net *net, struct udp_port_cfg *cfg, struct socket **sockp);
void *metaroce_glue_sk_user_data(struct sock *sk);
const struct iphdr *metaroce_glue_ip_hdr(const struct sk_buff *skb);
int metaroce_glue_skb_linearize(struct sk_buff *skb);
void metaroce_glue_kfree_skb(struct sk_buff *skb);
void metaroce_glue_consume_skb(struct sk_buff *skb);
struct sk_buff *metaroce_glue_alloc_skb(unsigned int size);
void metaroce_glue_skb_reserve(struct sk_buff *skb, int len);
unsigned int metaroce_glue_ll_reserved_space(const struct net_device *dev);
struct rtable *metaroce_glue_ip_route_output_key(struct net *net, struct flowi4 *fl);
void metaroce_glue_ip_rt_put(struct rtable *rt);
int metaroce_glue_ip4_dst_hoplimit(const struct rtable *rt);
const struct net_device *metaroce_glue_rt_dev(const struct rtable *rt);
void metaroce_glue_local_bh_disable(void);
void metaroce_glue_local_bh_enable(void);

#endif /* METAROCE_GLUE_NET_H */
