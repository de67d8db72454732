// SPDX-License-Identifier: GPL-2.0

//! The peer devices of a device: a list (the timers and plane changes walk it) and an index
//! of every address (IPv4 or IPv6) of every peer (plane 0's, the one its QPs named, and those its proven
//! HELLO gave), sorted, so that a datagram's peer is found by binary search, not by a scan of
//! the peers. Both live under the engine's `peers` lock, taken with bottom halves off; nothing
//! allocates under it: room for one more peer and its addresses is made before it is locked
//! ([`PeerTable::grow`]).

use super::{planes::MAX_PLANES, Peer};
use crate::net::NodeAddr;
use kernel::{prelude::*, sync::Arc};

/// An address and its peer's place in the list.
#[derive(Clone, Copy)]
struct Entry {
    addr: NodeAddr,
    pos: usize,
}

/// The peers and their addresses.
pub(crate) struct PeerTable {
    list: KVec<Arc<Peer>>,
    /// Sorted by address; at most `MAX_PLANES` entries per peer, one per address.
    index: KVec<Entry>,
}

impl PeerTable {
    pub(crate) const fn new() -> Self {
        PeerTable {
            list: KVec::new(),
            index: KVec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The `i`th peer.
    pub(crate) fn get(&self, i: usize) -> Option<&Arc<Peer>> {
        self.list.get(i)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Peer>> {
        self.list.iter()
    }

    fn slot(&self, addr: NodeAddr) -> core::result::Result<usize, usize> {
        self.index.binary_search_by_key(&addr, |e| e.addr)
    }

    /// The peer with address `addr` on any of its planes.
    pub(crate) fn find(&self, addr: NodeAddr) -> Option<&Arc<Peer>> {
        let i = self.slot(addr).ok()?;
        self.list.get(self.index.get(i)?.pos)
    }

    /// Whether one more peer (and its addresses) fits without allocating.
    fn has_room(&self) -> bool {
        let n = self.list.len() + 1;
        self.list.capacity() >= n && self.index.capacity() >= n * MAX_PLANES
    }

    /// Makes room for one more peer: allocations made outside the lock (`room`, from
    /// [`PeerTable::room_for_one_more`]) are moved in if larger. Returns what is no longer
    /// used, to be freed by the caller once unlocked.
    pub(crate) fn grow(&mut self, room: Room) -> Room {
        let Room {
            mut list,
            mut index,
        } = room;
        if list.capacity() > self.list.capacity() {
            list.clear();
            for p in self.list.drain_all() {
                // Within `list`'s larger capacity: no allocation.
                let _ = list.push_within_capacity(p);
            }
            core::mem::swap(&mut self.list, &mut list);
        }
        if index.capacity() > self.index.capacity() {
            index.clear();
            for e in self.index.drain_all() {
                let _ = index.push_within_capacity(e);
            }
            core::mem::swap(&mut self.index, &mut index);
        }
        Room { list, index }
    }

    /// What `grow` needs for one more peer, to allocate unlocked (`None`: there is room).
    pub(crate) fn room_wanted(&self) -> Option<(usize, usize)> {
        (!self.has_room()).then(|| {
            let n = (self.list.len() + 1).max(4).next_power_of_two();
            (n, n * MAX_PLANES)
        })
    }

    /// Adds `peer`, whose plane 0 address is `addr` (not in the table). `Err(peer)` without
    /// room (see [`PeerTable::grow`]).
    pub(crate) fn push(
        &mut self,
        peer: Arc<Peer>,
        addr: NodeAddr,
    ) -> core::result::Result<(), Arc<Peer>> {
        if !self.has_room() {
            return Err(peer);
        }
        let pos = self.list.len();
        if let Err(e) = self.list.push_within_capacity(peer) {
            return Err(e.0);
        }
        self.insert(addr, pos);
        Ok(())
    }

    /// Indexes `addr` for the peer at `pos` (within the room kept for every peer's planes).
    fn insert(&mut self, addr: NodeAddr, pos: usize) {
        if addr.is_none() {
            return;
        }
        if let Err(at) = self.slot(addr) {
            let _ = self.index.insert_within_capacity(at, Entry { addr, pos });
        }
    }

    fn unindex(&mut self, addr: NodeAddr) {
        if let Ok(i) = self.slot(addr) {
            let _ = self.index.remove(i);
        }
    }

    fn position(&self, peer: &Peer) -> Option<usize> {
        self.list
            .iter()
            .position(|q| core::ptr::eq::<Peer>(&**q, peer))
    }

    /// `peer`'s address changed from `old` to `new` (either may be none) on a plane other
    /// than 0. No allocation: every peer has room for `MAX_PLANES` addresses.
    pub(crate) fn readdress(
        &mut self,
        peer: &Peer,
        plane0: NodeAddr,
        old: NodeAddr,
        new: NodeAddr,
    ) {
        if old == new {
            return;
        }
        let Some(pos) = self
            .slot(plane0)
            .ok()
            .and_then(|i| self.index.get(i))
            .map(|e| e.pos)
        else {
            return;
        };
        if !self
            .list
            .get(pos)
            .is_some_and(|q| core::ptr::eq::<Peer>(&**q, peer))
        {
            return;
        }
        if !old.is_none()
            && self
                .slot(old)
                .ok()
                .and_then(|i| self.index.get(i))
                .is_some_and(|e| e.pos == pos)
        {
            self.unindex(old);
        }
        self.insert(new, pos);
    }

    /// Takes `peer` out (its addresses `addrs` unindexed); returns it.
    pub(crate) fn remove(&mut self, peer: &Peer, addrs: &[NodeAddr]) -> Option<Arc<Peer>> {
        let pos = self.position(peer)?;
        for &a in addrs {
            if self
                .slot(a)
                .ok()
                .and_then(|i| self.index.get(i))
                .is_some_and(|e| e.pos == pos)
            {
                self.unindex(a);
            }
        }
        let last = self.list.len() - 1;
        let gone = if pos == last {
            self.list.pop()?
        } else {
            // The last peer moves to `pos`: its entries follow.
            let moved = self.list.pop()?;
            let gone = core::mem::replace(self.list.get_mut(pos)?, moved);
            for e in self.index.iter_mut() {
                if e.pos == last {
                    e.pos = pos;
                }
            }
            gone
        };
        Some(gone)
    }

    /// Empties the table (device going away); returns what it held, to drop unlocked.
    pub(crate) fn take(&mut self) -> Room {
        Room {
            list: core::mem::replace(&mut self.list, KVec::new()),
            index: core::mem::replace(&mut self.index, KVec::new()),
        }
    }
}

/// Storage for a [`PeerTable`], allocated or freed outside its lock.
pub(crate) struct Room {
    list: KVec<Arc<Peer>>,
    index: KVec<Entry>,
}

impl Room {
    pub(crate) fn new() -> Self {
        Room {
            list: KVec::new(),
            index: KVec::new(),
        }
    }

    /// Room for `peers` peers and `addrs` addresses. Process context.
    pub(crate) fn with_capacity(peers: usize, addrs: usize) -> Result<Self> {
        Ok(Room {
            list: KVec::with_capacity(peers, GFP_KERNEL)?,
            index: KVec::with_capacity(addrs, GFP_KERNEL)?,
        })
    }
}
