// SPDX-License-Identifier: GPL-2.0
/*
 * Wrappers for kernel static inlines and macros, called from Rust (see glue.h). Keep each one a
 * single expression: the driver's logic belongs to the Rust side.
 */
#include <linux/cpumask.h>
#include <linux/hardirq.h>
#include <linux/highmem.h>
#include <linux/irqflags.h>
#include <linux/sched.h>
#include <linux/scatterlist.h>
#include <linux/spinlock.h>
#include <linux/timekeeping.h>
#include "glue.h"

struct net *metaroce_glue_dev_net(const struct net_device *ndev)
{
	return dev_net(ndev);
}

struct net_device *metaroce_glue_notifier_info_to_dev(void *info)
{
	return netdev_notifier_info_to_dev(info);
}

struct ib_device *metaroce_glue_device_to_ibdev(struct device *dev)
{
	return rdma_device_to_ibdev(dev);
}

bool metaroce_glue_ib_device_try_get(struct ib_device *dev)
{
	return ib_device_try_get(dev);
}

enum ib_port_state metaroce_glue_curr_port_state(struct net_device *ndev)
{
	return ib_get_curr_port_state(ndev);
}

unsigned int metaroce_glue_num_possible_cpus(void)
{
	return num_possible_cpus();
}

unsigned int metaroce_glue_nr_cpu_ids(void)
{
	return nr_cpu_ids;
}

bool metaroce_glue_cpu_possible(unsigned int cpu)
{
	return cpu_possible(cpu);
}

bool metaroce_glue_cpu_online(unsigned int cpu)
{
	return cpu_online(cpu);
}

int metaroce_glue_copy_to_udata(struct ib_udata *udata, void *src, size_t len)
{
	return ib_copy_to_udata(udata, src, len);
}

int metaroce_glue_copy_from_udata(void *dst, struct ib_udata *udata, size_t len)
{
	return ib_copy_from_udata(dst, udata, len);
}

bool metaroce_glue_is_udata_cleared(struct ib_udata *udata, size_t offset, size_t len)
{
	return ib_is_udata_cleared(udata, offset, len);
}

void metaroce_glue_dev_put(struct net_device *ndev)
{
	dev_put(ndev);
}

struct page *metaroce_glue_sg_page_iter_page(struct sg_page_iter *piter)
{
	return sg_page_iter_page(piter);
}

void *metaroce_glue_kmap_local_page(struct page *page)
{
	return kmap_local_page(page);
}

void metaroce_glue_kunmap_local(void *addr)
{
	kunmap_local(addr);
}

u64 metaroce_glue_mmap_get_offset(const struct rdma_user_mmap_entry *entry)
{
	return rdma_user_mmap_get_offset(entry);
}

u64 metaroce_glue_ktime_get_ns(void)
{
	return ktime_get_ns();
}

unsigned int metaroce_glue_smp_processor_id(void)
{
	return raw_smp_processor_id();
}

/* Whether the caller may take a spinlock that disables bottom halves: not in hard interrupt
 * context and not with interrupts disabled (local_bh_enable() must not run then). */
bool metaroce_glue_may_take_bh_locks(void)
{
	return !in_hardirq() && !irqs_disabled();
}

void metaroce_glue_set_current_interruptible(void)
{
	set_current_state(TASK_INTERRUPTIBLE);
}

void metaroce_glue_set_current_running(void)
{
	__set_current_state(TASK_RUNNING);
}

void metaroce_glue_spin_lock_bh(spinlock_t *lock)
{
	spin_lock_bh(lock);
}

bool metaroce_glue_spin_trylock_bh(spinlock_t *lock)
{
	return spin_trylock_bh(lock);
}

void metaroce_glue_spin_unlock_bh(spinlock_t *lock)
{
	spin_unlock_bh(lock);
}
