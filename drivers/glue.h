/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C side of the metaroce module: one exported wrapper per kernel static inline or macro
 * that Rust cannot call directly. No logic lives here; each wrapper is one expression.
 */
#ifndef METAROCE_GLUE_H
#define METAROCE_GLUE_H

#include <linux/netdevice.h>
#include <rdma/ib_verbs.h>

struct net *metaroce_glue_dev_net(const struct net_device *ndev);
struct net_device *metaroce_glue_notifier_info_to_dev(void *info);
struct ib_device *metaroce_glue_device_to_ibdev(struct device *dev);
bool metaroce_glue_ib_device_try_get(struct ib_device *dev);
enum ib_port_state metaroce_glue_curr_port_state(struct net_device *ndev);
unsigned int metaroce_glue_num_possible_cpus(void);
unsigned int metaroce_glue_nr_cpu_ids(void);
bool metaroce_glue_cpu_possible(unsigned int cpu);
bool metaroce_glue_cpu_online(unsigned int cpu);
int metaroce_glue_copy_to_udata(struct ib_udata *udata, void *src, size_t len);
int metaroce_glue_copy_from_udata(void *dst, struct ib_udata *udata, size_t len);
bool metaroce_glue_is_udata_cleared(struct ib_udata *udata, size_t offset, size_t len);
void metaroce_glue_dev_put(struct net_device *ndev);
struct page *metaroce_glue_sg_page_iter_page(struct sg_page_iter *piter);
void *metaroce_glue_kmap_local_page(struct page *page);
void metaroce_glue_kunmap_local(void *addr);
u64 metaroce_glue_mmap_get_offset(const struct rdma_user_mmap_entry *entry);
u64 metaroce_glue_ktime_get_ns(void);
unsigned int metaroce_glue_smp_processor_id(void);
bool metaroce_glue_may_take_bh_locks(void);
void metaroce_glue_set_current_interruptible(void);
void metaroce_glue_set_current_running(void);
void metaroce_glue_spin_lock_bh(spinlock_t *lock);
bool metaroce_glue_spin_trylock_bh(spinlock_t *lock);
void metaroce_glue_spin_unlock_bh(spinlock_t *lock);

#endif /* METAROCE_GLUE_H */
