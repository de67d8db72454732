// SPDX-License-Identifier: GPL-2.0

//! Multicast for UD QPs (rxe_mcast.c's role): `ibv_attach_mcast` / `ibv_detach_mcast` and
//! rdma_cm's joins, which end in them.
//!
//! - The groups and their QPs are `verbs_core::mcast`'s fixed table (`max_mcast_grp` groups
//!   of `max_mcast_qp_attach` QPs), allocated at the device's first attach.
//! - A group's first attach joins its IP group on every plane's netdev (IGMP or MLD, as a
//!   socket's membership would), and its last detach leaves it: the host then accepts the
//!   group's datagrams, and a fabric that snoops IGMP/MLD forwards them to it. rdma_cm joins
//!   an IPv4 group on the port's netdev itself as well (`cma_igmp_send`); the stack counts
//!   joins, so each leave undoes only its own.
//! - A UD send to QP `MULTICAST_QPN` at a multicast GID leaves as one IP multicast datagram
//!   (`ud.rs`), and is placed at once in this device's own QPs attached to the group (the IP
//!   stack's multicast loopback does not work for a tunnel socket), so QPs of the sending host
//!   receive it as the others do.
//! - An arriving multicast DATAGRAM is placed in every attached QP that takes it (its port,
//!   state and Q_Key, as a unicast one), each in its next receive WQE. It counts as received
//!   once if any QP took it, else as dropped.

use super::{datagrams::DgFrom, Engine};
use crate::{
    net::IpAddr,
    sys::netdev::Rtnl,
    transport::wire::{BaseHeader, DatagramExt},
    verbs_core::mcast::{self, Attached, Detached, Group, McastError, MAX_ATTACH, MAX_GROUPS},
};
use kernel::prelude::*;

fn errno(e: McastError) -> Error {
    match e {
        McastError::Invalid => EINVAL,
        McastError::Full => ENOMEM,
    }
}

impl Engine {
    /// Attaches UD QP `qpn` to the multicast group `gid`. Process context, without RTNL (it
    /// takes it).
    pub(crate) fn attach_mcast(&self, qpn: u32, gid: &[u8; 16]) -> Result {
        let _joins = self.datagrams.joins.lock();
        self.group_table()?;
        let attached = mcast::attach(&mut self.datagrams.groups.lock(), gid, qpn).map_err(errno)?;
        if attached == Attached::First {
            if let Err(e) = self.set_ip_group(gid, true) {
                let _ = mcast::detach(&mut self.datagrams.groups.lock(), gid, qpn);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Detaches QP `qpn` from the multicast group `gid` (`EINVAL` if it is not attached).
    /// Process context, without RTNL.
    pub(crate) fn detach_mcast(&self, qpn: u32, gid: &[u8; 16]) -> Result {
        let _joins = self.datagrams.joins.lock();
        let detached = mcast::detach(&mut self.datagrams.groups.lock(), gid, qpn).map_err(errno)?;
        if detached == Detached::Last {
            self.leave_ip_group(gid);
        }
        Ok(())
    }

    /// QP `qpn` is destroyed: it leaves every group it is still attached to (uverbs detaches
    /// a user QP's attachments before, so this finds none unless a detach failed). Process
    /// context, without RTNL.
    pub(crate) fn detach_mcast_everywhere(&self, qpn: u32) {
        let _joins = self.datagrams.joins.lock();
        loop {
            // One group at a time: the IP leave sleeps, so not under the table's lock.
            let mut emptied = None;
            {
                let mut table = self.datagrams.groups.lock();
                let gid = table
                    .iter()
                    .find(|g| g.members().contains(&qpn))
                    .map(|g| *g.gid());
                let Some(gid) = gid else { break };
                if let Ok(Detached::Last) = mcast::detach(&mut table, &gid, qpn) {
                    emptied = Some(gid);
                }
            }
            if let Some(gid) = emptied {
                self.leave_ip_group(&gid);
            }
        }
    }

    /// The group table, allocated if this is the first attach. Under `joins`.
    fn group_table(&self) -> Result {
        if !self.datagrams.groups.lock().is_empty() {
            return Ok(());
        }
        let mut table = KVVec::with_capacity(MAX_GROUPS, GFP_KERNEL)?;
        for _ in 0..MAX_GROUPS {
            table.push(Group::EMPTY, GFP_KERNEL)?;
        }
        // The old (empty) vector is dropped after the lock is released.
        let _old = core::mem::replace(&mut *self.datagrams.groups.lock(), table);
        Ok(())
    }

    /// Joins (`join`) or leaves the IP group of `gid` on every plane's netdev. A failed join
    /// undoes the joins before it.
    fn set_ip_group(&self, gid: &[u8; 16], join: bool) -> Result {
        let group = IpAddr::from_gid(gid);
        let rtnl = Rtnl::lock();
        let devs = self.plane_devs(&rtnl);
        for (i, dev) in devs.iter().enumerate() {
            let Some(dev) = dev else { continue };
            if let Err(e) = dev.set_multicast(&group, join) {
                if join {
                    for done in devs.iter().take(i).flatten() {
                        let _ = done.set_multicast(&group, false);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn leave_ip_group(&self, gid: &[u8; 16]) {
        // Leaving fails only where there is nothing to leave (a plane added since the join).
        let _ = self.set_ip_group(gid, false);
    }

    /// A multicast DATAGRAM arrived: placed in every attached QP that takes it. None if no
    /// QP of this device is attached to its group, else whether one took it.
    pub(super) fn mcast_deliver(
        &self,
        from: &DgFrom,
        b: &BaseHeader,
        d: &DatagramExt,
        payload: &[u8],
    ) -> Option<bool> {
        let gid = from.dst.gid();
        let mut qps = [0u32; MAX_ATTACH];
        let n = {
            let table = self.datagrams.groups.lock();
            let members = mcast::members(&table, &gid);
            for (slot, qpn) in qps.iter_mut().zip(members) {
                *slot = *qpn;
            }
            members.len().min(MAX_ATTACH)
        };
        if n == 0 {
            return None;
        }
        let mut taken = false;
        for &qpn in qps.iter().take(n) {
            taken |= self.ud_deliver(qpn, from, b, d, payload).is_ok();
        }
        Some(taken)
    }
}
