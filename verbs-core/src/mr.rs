// SPDX-License-Identifier: GPL-2.0

//! Memory regions: what an `ibv_rereg_mr` may change of an MR, and what it makes of it.
//!
//! A rereg changes the translation (the user memory and the address it is named by), the
//! protection domain and the access rights, in any combination, and keeps the MR's keys. The
//! core has checked the flags against `IB_MR_REREG_SUPPORTED`, the access flags (for
//! `IB_MR_REREG_ACCESS`) and that a new translation keeps the page offset; it has replaced an
//! unchanged PD by "no PD change". What is left is judged here.

/// `enum ib_mr_rereg_flags`.
pub mod rereg {
    /// `IB_MR_REREG_TRANS`: new memory (start, length) named by a new iova.
    pub const TRANS: u32 = 1;
    /// `IB_MR_REREG_PD`: another protection domain.
    pub const PD: u32 = 1 << 1;
    /// `IB_MR_REREG_ACCESS`: other access rights.
    pub const ACCESS: u32 = 1 << 2;
}

/// The parts of an MR a rereg may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrShape {
    /// The address the application names the region by.
    pub iova: u64,
    /// Its length in bytes.
    pub length: u64,
    /// `IB_ACCESS_*` rights.
    pub access: u32,
    /// Its protection domain, by identity.
    pub pd: usize,
}

/// What a rereg asks for: its flags and the values they name (the others are ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rereg {
    /// `IB_MR_REREG_*`.
    pub flags: u32,
    /// With `TRANS`: the new user memory's start and length, and its iova.
    pub start: u64,
    /// With `TRANS`: the new length.
    pub length: u64,
    /// With `TRANS`: the new iova.
    pub iova: u64,
    /// With `ACCESS`: the new rights.
    pub access: u32,
    /// With `PD`: the new protection domain.
    pub pd: usize,
}

/// Why a rereg is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReregError {
    /// No flag, or one this device does not know (`EOPNOTSUPP` for unknown ones, as the core).
    Unsupported,
    /// A new translation of no bytes, or one whose end does not fit in 64 bits (`EINVAL`).
    Invalid,
    /// Writable rights over memory that was pinned read-only, without new memory to pin
    /// writable (`EACCES`, as `ib_umem_check_rereg`).
    NotWritable,
}

/// Whether `access` lets anyone write the memory (`ib_access_writable`): local or remote
/// writes, or remote atomics.
pub fn writable(access: u32) -> bool {
    use super::ib::access::{LOCAL_WRITE, REMOTE_ATOMIC, REMOTE_WRITE};
    access & (LOCAL_WRITE | REMOTE_WRITE | REMOTE_ATOMIC) != 0
}

/// Judges the rereg `r` of an MR shaped `old` whose memory was pinned writable or not
/// (`pinned_writable`). Returns the MR's new shape and whether new memory is to be pinned
/// (`TRANS`: `r.start`, `r.length` with the new shape's rights); changes nothing.
pub fn judge_rereg(
    old: &MrShape,
    pinned_writable: bool,
    r: &Rereg,
) -> Result<(MrShape, bool), ReregError> {
    let known = rereg::TRANS | rereg::PD | rereg::ACCESS;
    if r.flags == 0 || r.flags & !known != 0 {
        return Err(ReregError::Unsupported);
    }
    let mut new = *old;
    if r.flags & rereg::ACCESS != 0 {
        new.access = r.access;
    }
    if r.flags & rereg::PD != 0 {
        new.pd = r.pd;
    }
    let trans = r.flags & rereg::TRANS != 0;
    if trans {
        if r.length == 0
            || r.iova.checked_add(r.length).is_none()
            || r.start.checked_add(r.length).is_none()
        {
            return Err(ReregError::Invalid);
        }
        new.iova = r.iova;
        new.length = r.length;
    } else if r.flags & rereg::ACCESS != 0 && writable(new.access) && !pinned_writable {
        return Err(ReregError::NotWritable);
    }
    Ok((new, trans))
}

#[cfg(test)]
mod tests {
    use super::super::ib::access::*;
    use super::*;

    const OLD: MrShape = MrShape {
        iova: 0x1000,
        length: 4096,
        access: LOCAL_WRITE,
        pd: 7,
    };

    fn req(flags: u32) -> Rereg {
        Rereg {
            flags,
            start: 0x7f00_0000_2000,
            length: 8192,
            iova: 0x2000,
            access: REMOTE_READ,
            pd: 9,
        }
    }

    #[test]
    fn each_flag_changes_only_its_part() {
        let (n, pin) = judge_rereg(&OLD, true, &req(rereg::PD)).unwrap();
        assert_eq!((n, pin), (MrShape { pd: 9, ..OLD }, false));
        let (n, pin) = judge_rereg(&OLD, true, &req(rereg::ACCESS)).unwrap();
        assert_eq!(
            (n, pin),
            (
                MrShape {
                    access: REMOTE_READ,
                    ..OLD
                },
                false
            )
        );
        let (n, pin) = judge_rereg(&OLD, true, &req(rereg::TRANS)).unwrap();
        assert_eq!(
            (n, pin),
            (
                MrShape {
                    iova: 0x2000,
                    length: 8192,
                    ..OLD
                },
                true
            )
        );
        let all = rereg::TRANS | rereg::PD | rereg::ACCESS;
        let (n, pin) = judge_rereg(&OLD, false, &req(all)).unwrap();
        let want = MrShape {
            iova: 0x2000,
            length: 8192,
            access: REMOTE_READ,
            pd: 9,
        };
        assert_eq!((n, pin), (want, true));
    }

    #[test]
    fn no_flag_or_an_unknown_one_is_unsupported() {
        assert_eq!(
            judge_rereg(&OLD, true, &req(0)),
            Err(ReregError::Unsupported)
        );
        assert_eq!(
            judge_rereg(&OLD, true, &req(rereg::PD | 1 << 3)),
            Err(ReregError::Unsupported)
        );
    }

    #[test]
    fn an_empty_or_wrapping_translation_is_invalid() {
        let mut r = req(rereg::TRANS);
        r.length = 0;
        assert_eq!(judge_rereg(&OLD, true, &r), Err(ReregError::Invalid));
        let mut r = req(rereg::TRANS);
        r.iova = u64::MAX - 100;
        assert_eq!(judge_rereg(&OLD, true, &r), Err(ReregError::Invalid));
        let mut r = req(rereg::TRANS);
        r.start = u64::MAX - 100;
        assert_eq!(judge_rereg(&OLD, true, &r), Err(ReregError::Invalid));
    }

    #[test]
    fn write_rights_over_read_only_pages_need_new_pages() {
        let ro = MrShape {
            access: REMOTE_READ,
            ..OLD
        };
        let mut r = req(rereg::ACCESS);
        r.access = LOCAL_WRITE | REMOTE_WRITE;
        assert_eq!(judge_rereg(&ro, false, &r), Err(ReregError::NotWritable));
        // Pinned writable, or new memory pinned with the new rights: allowed.
        assert!(judge_rereg(&ro, true, &r).is_ok());
        r.flags |= rereg::TRANS;
        assert_eq!(judge_rereg(&ro, false, &r).map(|(_, pin)| pin), Ok(true));
        // Dropping write rights never needs new pages.
        let mut r = req(rereg::ACCESS);
        r.access = REMOTE_READ;
        assert!(judge_rereg(&OLD, false, &r).is_ok());
        // A PD change alone keeps the rights the pages were pinned for.
        assert!(judge_rereg(&ro, false, &req(rereg::PD)).is_ok());
    }

    #[test]
    fn writable_is_ib_access_writable() {
        assert!(writable(LOCAL_WRITE));
        assert!(writable(REMOTE_WRITE));
        assert!(writable(REMOTE_ATOMIC));
        assert!(!writable(REMOTE_READ));
        assert!(!writable(0));
    }
}
