/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C wrappers for the networking static inlines and macros the UDP transport layer
 * (drivers/sys/udp.rs) calls. As in glue.h: no logic (one expression each; a callback set
 * under its lock).
 */
#ifndef METAROCE_GLUE_NET_H
#define METAROCE_GLUE_NET_H

#include <linux/skbuff.h>
#include <linux/udp.h>
#include <net/route.h>
#include <net/udp_tunnel.h>

void *metaroce_glue_sk_user_data(struct sock *sk);
int metaroce_glue_skb_linearize(struct sk_buff *skb);
unsigned char *metaroce_glue_skb_network_header(const struct sk_buff *skb);
unsigned char *metaroce_glue_skb_transport_header(const struct sk_buff *skb);
unsigned char *metaroce_glue_skb_tail(const struct sk_buff *skb);
struct sk_buff *metaroce_glue_alloc_skb_atomic(unsigned int size);
void metaroce_glue_skb_reserve(struct sk_buff *skb, int len);
struct skb_shared_info *metaroce_glue_skb_shinfo(struct sk_buff *skb);
struct rtable *metaroce_glue_ip_route_output_key(struct net *net, struct flowi4 *fl4);
void metaroce_glue_ip_rt_put(struct rtable *rt);
struct dst_entry *metaroce_glue_rt_dst(struct rtable *rt);
int metaroce_glue_ip4_dst_hoplimit(const struct dst_entry *dst);
unsigned int metaroce_glue_dst_ll_reserved_space(const struct dst_entry *dst);
unsigned int metaroce_glue_dst_mtu(const struct dst_entry *dst);
void metaroce_glue_kfree_skb(struct sk_buff *skb);
void metaroce_glue_local_bh_disable(void);
void metaroce_glue_local_bh_enable(void);
void metaroce_glue_skb_get(struct sk_buff *skb);
struct sk_buff *metaroce_glue_skb_next(const struct sk_buff *skb);
void metaroce_glue_sk_set_data_ready(struct sock *sk, void (*data_ready)(struct sock *sk), int rcvbuf);
void metaroce_glue_udp_set_encap_rcv(struct sock *sk,
				     int (*encap_rcv)(struct sock *sk, struct sk_buff *skb));
void metaroce_glue_inet_dec_convert_csum(struct sock *sk);
void metaroce_glue_udp_accept_gso(struct sock *sk);
bool metaroce_glue_udp_csum_ok(struct sk_buff *skb);
bool metaroce_glue_udp_rx_pending(struct sock *sk);
int metaroce_glue_ip_mc_group(struct net_device *dev, __be32 addr, bool join);

#endif /* METAROCE_GLUE_NET_H */
