// SPDX-License-Identifier: GPL-2.0
/* Networking wrappers for drivers/sys/udp.rs; see glue_net.h. */
#include <linux/igmp.h>
#include <linux/inetdevice.h>
#include <linux/netdevice.h>
#include <net/dst.h>
#include <net/sock.h>
#include <net/udp.h>
#include "glue_net.h"

void *metaroce_glue_sk_user_data(struct sock *sk)
{
	return rcu_dereference_sk_user_data(sk);
}

int metaroce_glue_skb_linearize(struct sk_buff *skb)
{
	return skb_linearize(skb);
}

unsigned char *metaroce_glue_skb_network_header(const struct sk_buff *skb)
{
	return skb_network_header(skb);
}

unsigned char *metaroce_glue_skb_transport_header(const struct sk_buff *skb)
{
	return skb_transport_header(skb);
}

unsigned char *metaroce_glue_skb_tail(const struct sk_buff *skb)
{
	return skb_tail_pointer(skb);
}

struct sk_buff *metaroce_glue_alloc_skb_atomic(unsigned int size)
{
	return alloc_skb(size, GFP_ATOMIC);
}

void metaroce_glue_skb_reserve(struct sk_buff *skb, int len)
{
	skb_reserve(skb, len);
}

struct skb_shared_info *metaroce_glue_skb_shinfo(struct sk_buff *skb)
{
	return skb_shinfo(skb);
}

struct rtable *metaroce_glue_ip_route_output_key(struct net *net, struct flowi4 *fl4)
{
	return ip_route_output_key(net, fl4);
}

void metaroce_glue_ip_rt_put(struct rtable *rt)
{
	ip_rt_put(rt);
}

struct dst_entry *metaroce_glue_rt_dst(struct rtable *rt)
{
	return &rt->dst;
}

int metaroce_glue_ip4_dst_hoplimit(const struct dst_entry *dst)
{
	return ip4_dst_hoplimit(dst);
}

unsigned int metaroce_glue_dst_ll_reserved_space(const struct dst_entry *dst)
{
	return LL_RESERVED_SPACE(dst_dev(dst));
}

unsigned int metaroce_glue_dst_mtu(const struct dst_entry *dst)
{
	return dst_mtu(dst);
}

void metaroce_glue_kfree_skb(struct sk_buff *skb)
{
	kfree_skb(skb);
}

void metaroce_glue_local_bh_disable(void)
{
	local_bh_disable();
}

void metaroce_glue_local_bh_enable(void)
{
	local_bh_enable();
}

void metaroce_glue_skb_get(struct sk_buff *skb)
{
	skb_get(skb);
}

struct sk_buff *metaroce_glue_skb_next(const struct sk_buff *skb)
{
	return skb->next;
}

/*
 * Points sk's data_ready callback at ours (under sk_callback_lock, as other kernel socket
 * users do) and sets its receive buffer.
 */
void metaroce_glue_sk_set_data_ready(struct sock *sk, void (*data_ready)(struct sock *sk), int rcvbuf)
{
	write_lock_bh(&sk->sk_callback_lock);
	sk->sk_data_ready = data_ready;
	write_unlock_bh(&sk->sk_callback_lock);
	WRITE_ONCE(sk->sk_rcvbuf, rcvbuf);
}

/* Sets (or clears, with NULL) the encap_rcv of a socket set up as a UDP tunnel's. */
void metaroce_glue_udp_set_encap_rcv(struct sock *sk,
				     int (*encap_rcv)(struct sock *sk, struct sk_buff *skb))
{
	WRITE_ONCE(udp_sk(sk)->encap_rcv, encap_rcv);
}

/* Undoes setup_udp_tunnel_sock's inet_inc_convert_csum (a static inline). */
void metaroce_glue_inet_dec_convert_csum(struct sock *sk)
{
	inet_dec_convert_csum(sk);
}

/* UDP GSO packets are queued on sk whole, as for a socket with UDP_GRO set. */
void metaroce_glue_udp_accept_gso(struct sock *sk)
{
	udp_set_bit(ACCEPT_L4, sk);
}

/* Whether a datagram taken from a UDP socket's queue has a good checksum, as udp_recvmsg judges. */
bool metaroce_glue_udp_csum_ok(struct sk_buff *skb)
{
	return udp_skb_csum_unnecessary(skb) || !__udp_lib_checksum_complete(skb);
}

/* Whether sk has datagrams queued (either of its receive queues). */
bool metaroce_glue_udp_rx_pending(struct sock *sk)
{
	return !skb_queue_empty_lockless(&udp_sk(sk)->reader_queue) ||
	       !skb_queue_empty_lockless(&sk->sk_receive_queue);
}

/*
 * Joins (join) or leaves the IPv4 multicast group addr on dev, as rdma_cm's cma_igmp_send
 * does: __in_dev_get_rtnl and ip_mc_dec_group are static inlines. RTNL held.
 */
int metaroce_glue_ip_mc_group(struct net_device *dev, __be32 addr, bool join)
{
	struct in_device *in_dev = __in_dev_get_rtnl(dev);

	if (!in_dev)
		return -ENODEV;
	if (join)
		ip_mc_inc_group(in_dev, addr);
	else
		ip_mc_dec_group(in_dev, addr);
	return 0;
}
