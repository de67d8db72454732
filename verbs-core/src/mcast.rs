// SPDX-License-Identifier: GPL-2.0

//! Multicast groups: which UD QPs `ibv_attach_mcast` (and rdma_cm's joins, through it) attached
//! to which multicast GID, as rxe's `rxe_mcast.c` keeps them.
//!
//! - A group is named by its GID: an IPv6 multicast address (`ff00::/8`) or an IPv4 one
//!   mapped into IPv6 (`::ffff:224.0.0.0/100`, what rdma_cm makes of an IPv4 group on a RoCEv2
//!   port). A datagram sent to QP `MULTICAST_QPN` at such a GID goes out as IP multicast to
//!   that address; one that arrives is placed in every attached QP that takes it (its port,
//!   state and Q_Key), as a switch replicates it to every member.
//! - The table is fixed in size: [`MAX_GROUPS`] groups of at most [`MAX_ATTACH`] QPs each
//!   (`max_mcast_grp`, `max_mcast_qp_attach`; `max_total_mcast_qp_attach` is their product),
//!   so no user can make the device allocate beyond it. Past either limit an attach fails with
//!   `ENOMEM`, as rxe's does.
//! - Attaching a QP twice to one group is no error and changes nothing (rxe); detaching a QP
//!   that is not attached is `EINVAL`. The first attach to a group and its last detach say so
//!   ([`Attached::First`], [`Detached::Last`]): the driver then joins or leaves the IP group on
//!   its netdevs, so that the host accepts the group's packets.

/// The QP number a multicast datagram is sent to (`0xFFFFFF`, the IBA's multicast QPN).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// Groups per device (`max_mcast_grp`).
pub const MAX_GROUPS: usize = 256;
/// QPs per group (`max_mcast_qp_attach`, rxe's figure).
pub const MAX_ATTACH: usize = 56;

/// Whether `gid` names a multicast group: IPv6 multicast, or IPv4 multicast mapped into IPv6
/// (the kernel's `rdma_is_multicast_addr`).
pub fn is_multicast(gid: &[u8; 16]) -> bool {
    let v4_mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    if v4_mapped {
        gid[12] & 0xf0 == 0xe0
    } else {
        gid[0] == 0xff
    }
}

/// One group: its GID and the QPs attached, in the order they came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    gid: [u8; 16],
    /// QPs attached; 0 marks a free slot of the table.
    len: u8,
    qps: [u32; MAX_ATTACH],
}

const _: () = assert!(MAX_ATTACH <= u8::MAX as usize);

impl Group {
    /// A free slot.
    pub const EMPTY: Group = Group {
        gid: [0; 16],
        len: 0,
        qps: [0; MAX_ATTACH],
    };

    /// Its GID.
    pub fn gid(&self) -> &[u8; 16] {
        &self.gid
    }

    /// The QPs attached.
    pub fn members(&self) -> &[u32] {
        self.qps.get(..usize::from(self.len)).unwrap_or(&[])
    }

    fn is_free(&self) -> bool {
        self.len == 0
    }
}

/// Why an attach or a detach is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastError {
    /// Not a multicast GID, or (detach) the QP is not attached to it: `EINVAL`.
    Invalid,
    /// The table holds [`MAX_GROUPS`] groups, or the group [`MAX_ATTACH`] QPs: `ENOMEM`.
    Full,
}

/// What an attach did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// The QP is the group's first member: the group is new.
    First,
    /// The QP joined a group that had members.
    Joined,
    /// The QP was attached already: nothing changed.
    Already,
}

/// What a detach did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detached {
    /// The QP was the group's last member: the group is gone.
    Last,
    /// Others remain.
    Left,
}

/// Attaches QP `qpn` to the group `gid` in `table` (every slot of which is a group or
/// [`Group::EMPTY`]; its length is the number of groups the device allows).
pub fn attach(table: &mut [Group], gid: &[u8; 16], qpn: u32) -> Result<Attached, McastError> {
    if !is_multicast(gid) {
        return Err(McastError::Invalid);
    }
    if let Some(g) = table.iter_mut().find(|g| !g.is_free() && g.gid == *gid) {
        if g.members().contains(&qpn) {
            return Ok(Attached::Already);
        }
        let slot = g.qps.get_mut(usize::from(g.len)).ok_or(McastError::Full)?;
        *slot = qpn;
        g.len += 1;
        return Ok(Attached::Joined);
    }
    let g = table
        .iter_mut()
        .find(|g| g.is_free())
        .ok_or(McastError::Full)?;
    *g = Group {
        gid: *gid,
        len: 1,
        qps: [0; MAX_ATTACH],
    };
    g.qps[0] = qpn;
    Ok(Attached::First)
}

/// Detaches QP `qpn` from the group `gid` in `table`. The others stay in the order they came.
pub fn detach(table: &mut [Group], gid: &[u8; 16], qpn: u32) -> Result<Detached, McastError> {
    let g = table
        .iter_mut()
        .find(|g| !g.is_free() && g.gid == *gid)
        .ok_or(McastError::Invalid)?;
    let at = g
        .members()
        .iter()
        .position(|&q| q == qpn)
        .ok_or(McastError::Invalid)?;
    let len = usize::from(g.len);
    g.qps.copy_within(at + 1..len, at);
    g.len -= 1;
    if g.is_free() {
        *g = Group::EMPTY;
        return Ok(Detached::Last);
    }
    Ok(Detached::Left)
}

/// Detaches QP `qpn` from every group it is attached to (it is being destroyed): calls `left`
/// with the GID of each group it was the last member of.
pub fn detach_everywhere(table: &mut [Group], qpn: u32, mut left: impl FnMut(&[u8; 16])) {
    for i in 0..table.len() {
        let Some(g) = table.get(i) else { break };
        if g.is_free() || !g.members().contains(&qpn) {
            continue;
        }
        let gid = g.gid;
        if let Ok(Detached::Last) = detach(table, &gid, qpn) {
            left(&gid);
        }
    }
}

/// The QPs attached to the group `gid` (none if there is no such group).
pub fn members<'a>(table: &'a [Group], gid: &[u8; 16]) -> &'a [u32] {
    table
        .iter()
        .find(|g| !g.is_free() && g.gid == *gid)
        .map_or(&[], Group::members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// `::ffff:a.b.c.d`.
    fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        let mut g = [0; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[a, b, c, d]);
        g
    }

    fn v6_mc(last: u8) -> [u8; 16] {
        let mut g = [0; 16];
        g[0] = 0xff;
        g[1] = 0x0e;
        g[15] = last;
        g
    }

    #[test]
    fn multicast_gids_as_the_kernel_sees_them() {
        assert!(is_multicast(&v4(224, 0, 0, 1)));
        assert!(is_multicast(&v4(230, 1, 2, 3)));
        assert!(is_multicast(&v4(239, 255, 255, 255)));
        assert!(!is_multicast(&v4(240, 0, 0, 1)));
        assert!(!is_multicast(&v4(10, 0, 0, 1)));
        assert!(is_multicast(&v6_mc(1)));
        let mut link_local = [0; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        assert!(!is_multicast(&link_local));
        assert!(!is_multicast(&[0; 16]));
        // IPv4-compatible (not mapped) 230.0.0.1 is no IPv4 multicast address.
        let mut compat = v4(230, 0, 0, 1);
        compat[10] = 0;
        compat[11] = 0;
        assert!(!is_multicast(&compat));
    }

    #[test]
    fn attach_and_detach() {
        let mut t = vec![Group::EMPTY; 4];
        let g = v4(230, 1, 2, 3);
        assert_eq!(attach(&mut t, &g, 0x11), Ok(Attached::First));
        assert_eq!(attach(&mut t, &g, 0x12), Ok(Attached::Joined));
        assert_eq!(attach(&mut t, &g, 0x11), Ok(Attached::Already));
        assert_eq!(members(&t, &g), &[0x11, 0x12]);
        assert_eq!(detach(&mut t, &g, 0x13), Err(McastError::Invalid));
        assert_eq!(
            detach(&mut t, &v4(230, 1, 2, 4), 0x11),
            Err(McastError::Invalid)
        );
        assert_eq!(detach(&mut t, &g, 0x11), Ok(Detached::Left));
        assert_eq!(members(&t, &g), &[0x12]);
        assert_eq!(detach(&mut t, &g, 0x12), Ok(Detached::Last));
        assert_eq!(members(&t, &g), &[] as &[u32]);
        assert!(t.iter().all(|s| *s == Group::EMPTY));
        // A unicast GID is no group.
        assert_eq!(
            attach(&mut t, &v4(10, 0, 0, 1), 1),
            Err(McastError::Invalid)
        );
    }

    #[test]
    fn limits() {
        let mut t = vec![Group::EMPTY; 2];
        assert_eq!(attach(&mut t, &v6_mc(1), 1), Ok(Attached::First));
        assert_eq!(attach(&mut t, &v6_mc(2), 1), Ok(Attached::First));
        assert_eq!(attach(&mut t, &v6_mc(3), 1), Err(McastError::Full));
        for q in 2..=MAX_ATTACH as u32 {
            assert_eq!(attach(&mut t, &v6_mc(1), q), Ok(Attached::Joined));
        }
        assert_eq!(
            attach(&mut t, &v6_mc(1), MAX_ATTACH as u32 + 1),
            Err(McastError::Full)
        );
        // Attaching one already there is still no error when the group is full.
        assert_eq!(attach(&mut t, &v6_mc(1), 7), Ok(Attached::Already));
        // A group freed makes room for another.
        assert_eq!(detach(&mut t, &v6_mc(2), 1), Ok(Detached::Last));
        assert_eq!(attach(&mut t, &v6_mc(3), 1), Ok(Attached::First));
    }

    #[test]
    fn a_destroyed_qp_leaves_every_group() {
        let mut t = vec![Group::EMPTY; 4];
        attach(&mut t, &v6_mc(1), 5).unwrap();
        attach(&mut t, &v6_mc(1), 6).unwrap();
        attach(&mut t, &v6_mc(2), 5).unwrap();
        attach(&mut t, &v6_mc(3), 6).unwrap();
        let mut gone = Vec::new();
        detach_everywhere(&mut t, 5, |g| gone.push(*g));
        assert_eq!(gone, vec![v6_mc(2)]);
        assert_eq!(members(&t, &v6_mc(1)), &[6]);
        assert_eq!(members(&t, &v6_mc(2)), &[] as &[u32]);
        assert_eq!(members(&t, &v6_mc(3)), &[6]);
    }
}
