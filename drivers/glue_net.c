// SPDX-License-Identifier: GPL-2.0
/* Networking wrappers for drivers/sys/socket.rs; see glue_net.h. */
#include "glue_net.h"

int metaroce_glue_udp_sock_create(struct net *net, struct udp_port_cfg *cfg, struct socket **sockp)
{
	return udp_sock_create(net, cfg, sockp);
}

void *metaroce_glue_sk_user_data(struct sock *sk)
{
	return rcu_dereference_sk_user_data(sk);
}

const struct iphdr *metaroce_glue_ip_hdr(const struct sk_buff *skb)
{
	return ip_hdr(skb);
}

int metaroce_glue_skb_linearize(struct sk_buff *skb)
{
	return skb_linearize(skb);
}

void metaroce_glue_kfree_skb(struct sk_buff *skb)
{
	kfree_skb(skb);
}

void metaroce_glue_consume_skb(struct sk_buff *skb)
{
	consume_skb(skb);
}

struct sk_buff *metaroce_glue_alloc_skb(unsigned int size)
{
	return alloc_skb(size, GFP_ATOMIC);
}

void metaroce_glue_skb_reserve(struct sk_buff *skb, int len)
{
	skb_reserve(skb, len);
}

unsigned int metaroce_glue_ll_reserved_space(const struct net_device *dev)
{
	return LL_RESERVED_SPACE(dev);
}

struct rtable *metaroce_glue_ip_route_output_key(struct net *net, struct flowi4 *fl)
{
	return ip_route_output_key(net, fl);
}

void metaroce_glue_ip_rt_put(struct rtable *rt)
{
	ip_rt_put(rt);
}

int metaroce_glue_ip4_dst_hoplimit(const struct rtable *rt)
{
	return ip4_dst_hoplimit(&rt->dst);
}

const struct net_device *metaroce_glue_rt_dev(const struct rtable *rt)
{
	return rt->dst.dev;
}

void metaroce_glue_local_bh_disable(void)
{
	local_bh_disable();
}

void metaroce_glue_local_bh_enable(void)
{
	local_bh_enable();
}
