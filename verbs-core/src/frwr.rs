// SPDX-License-Identifier: GPL-2.0

//! Fast registration memory regions (FRWR), as kernel consumers use them (NVMe-oF, NFS over
//! RDMA, iSER, SMB Direct through `ib_alloc_mr`, `ib_map_mr_sg`, `IB_WR_REG_MR` and
//! `IB_WR_LOCAL_INV` or a peer's SEND with invalidate).
//!
//! An FRWR MR is allocated empty for at most `max_pages` pages. `ib_map_mr_sg` stages a page
//! list (page-aligned kernel addresses, `page_size` each, the region starting `iova %
//! page_size` bytes into the first); an `IB_WR_REG_MR` work request, carried out in its send
//! queue's order, makes the staged list the region's, with the rights and the key (only its
//! low byte may change: `ib_update_fast_reg_key`) the request names, and the `iova` and
//! `length` the MR had when the request was posted: a consumer may renumber the region after
//! mapping it (xprtrdma puts the RPC's XID in the iova's upper half), which changes the
//! addresses the peer uses, not the bytes they reach. A local or remote invalidate makes it
//! unreachable again. Each rule cites what rxe's `rxe_mr.c` checks.

use super::ib::access;

/// Pages an FRWR MR may map (`max_fast_reg_page_list_len`).
pub const MAX_PAGES: u32 = 512;

/// The rights a registration may grant.
pub const REG_ACCESS: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;

/// Why a registration, invalidation or access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrwrError {
    /// The key names another MR (its index differs), or not this registration's key.
    Key,
    /// The QP is not in the MR's protection domain.
    Pd,
    /// Registered already: it is invalidated first.
    State,
    /// Rights the region cannot have (remote write or atomic without local write, or a flag
    /// beyond [`REG_ACCESS`]).
    Rights,
    /// Nothing staged, a page size that is not a power of two of at least 512 bytes, or a
    /// length beyond the staged pages.
    Mapping,
    /// Outside the region.
    Bounds,
    /// The region does not grant the access.
    Permission,
}

/// A page list staged by `ib_map_mr_sg` (what `ib_sg_to_pages` computed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Staged {
    /// The region's first byte, as the consumer addresses it.
    pub iova: u64,
    /// Its length in bytes.
    pub length: u64,
    /// Bytes per page (a power of two).
    pub page_size: u32,
    /// Pages staged.
    pub pages: u32,
}

/// A registration in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The key (lkey and rkey).
    pub key: u32,
    /// The region's first byte as the peer addresses it.
    pub iova: u64,
    /// Its length in bytes.
    pub length: u64,
    /// The staged list it maps (its `iova` gives the region's offset in the first page).
    pub map: Staged,
    /// `IB_ACCESS_*` rights.
    pub access: u32,
}

/// An `IB_WR_REG_MR` as posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegWr {
    /// The key the MR gets.
    pub key: u32,
    /// The rights it grants (`IB_ACCESS_*`).
    pub access: u32,
    /// The MR's `iova` when the request was posted.
    pub iova: u64,
    /// The MR's `length` then.
    pub length: u64,
}

/// An FRWR MR as the rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrwrState {
    /// Its protection domain, by identity.
    pub pd: usize,
    /// Its key now (what `ib_alloc_mr` returned, or the last registration's).
    pub key: u32,
    /// Pages it may map.
    pub max_pages: u32,
    /// Registered (valid), or free.
    pub reg: Option<Registration>,
}

/// Judges the `IB_WR_REG_MR` `wr` of `mr` by a QP of protection domain `qp_pd`, with `staged`
/// what `ib_map_mr_sg` left; returns the registration, changing nothing.
pub fn judge_reg(
    mr: &FrwrState,
    qp_pd: usize,
    wr: &RegWr,
    staged: &Staged,
) -> Result<Registration, FrwrError> {
    let (key, rights) = (wr.key, wr.access);
    // rxe_reg_fast_mr: the key keeps the MR's index; only the consumer's byte changes.
    if key & !0xff != mr.key & !0xff {
        return Err(FrwrError::Key);
    }
    // The QP and the MR are in one protection domain.
    if mr.pd != qp_pd {
        return Err(FrwrError::Pd);
    }
    // rxe_reg_fast_mr: only a free MR is registered.
    if mr.reg.is_some() {
        return Err(FrwrError::State);
    }
    // Remote write and remote atomic need local write (the core's `ib_check_mr_access`).
    let needs_local = access::REMOTE_WRITE | access::REMOTE_ATOMIC;
    if rights & !REG_ACCESS != 0 || (rights & needs_local != 0 && rights & access::LOCAL_WRITE == 0)
    {
        return Err(FrwrError::Rights);
    }
    if staged.pages == 0
        || staged.pages > mr.max_pages
        || !staged.page_size.is_power_of_two()
        || staged.page_size < 512
    {
        return Err(FrwrError::Mapping);
    }
    // The region's bytes are the staged ones: its length may not exceed what was mapped,
    // however the consumer renumbered it.
    let first = staged.iova % u64::from(staged.page_size.max(1));
    let mapped = u64::from(staged.pages) * u64::from(staged.page_size);
    if wr.length > staged.length
        || first.checked_add(wr.length).is_none_or(|end| end > mapped)
        || wr.iova.checked_add(wr.length).is_none()
    {
        return Err(FrwrError::Mapping);
    }
    Ok(Registration {
        key,
        iova: wr.iova,
        length: wr.length,
        map: *staged,
        access: rights,
    })
}

/// Judges a local invalidate (or a peer's SEND with invalidate) of `key` by a QP of
/// protection domain `qp_pd`. rxe_invalidate_mr: the key must be the MR's; invalidating a
/// free MR is no error.
pub fn judge_invalidate(mr: &FrwrState, qp_pd: usize, key: u32) -> Result<(), FrwrError> {
    if key != mr.key {
        return Err(FrwrError::Key);
    }
    if mr.pd != qp_pd {
        return Err(FrwrError::Pd);
    }
    Ok(())
}

/// One piece of an access: `len` bytes at `offset` into page `page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index into the page list.
    pub page: usize,
    /// Byte offset in that page.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

impl Registration {
    /// Checks an access of `len` bytes at `va` needing `needed` rights (0: a local read),
    /// and returns the offset of `va` from the first page's start.
    pub fn locate(&self, va: u64, len: u64, needed: u32) -> Result<u64, FrwrError> {
        if self.access & needed != needed {
            return Err(FrwrError::Permission);
        }
        let off = va.checked_sub(self.iova).ok_or(FrwrError::Bounds)?;
        let end = off.checked_add(len).ok_or(FrwrError::Bounds)?;
        if end > self.length {
            return Err(FrwrError::Bounds);
        }
        Ok(off + self.map.iova % u64::from(self.map.page_size.max(1)))
    }

    /// The pieces, page by page, of `len` bytes from `start` (a [`Registration::locate`]
    /// result).
    pub fn pieces(&self, start: u64, len: usize) -> impl Iterator<Item = Piece> {
        // A registration's page size is a power of two (`judge_reg`); never 0 here.
        let ps = (self.map.page_size as usize).max(1);
        let mut at = start as usize;
        let end = at + len;
        core::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let offset = at % ps;
            let n = (ps - offset).min(end - at);
            let p = Piece {
                page: at / ps,
                offset,
                len: n,
            };
            at += n;
            Some(p)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const PD: usize = 7;
    const LW: u32 = access::LOCAL_WRITE;
    const RW: u32 = access::REMOTE_WRITE;
    const RR: u32 = access::REMOTE_READ;

    fn free() -> FrwrState {
        FrwrState {
            pd: PD,
            key: 0x1234_5601,
            max_pages: 8,
            reg: None,
        }
    }

    fn wr(key: u32, access: u32) -> RegWr {
        RegWr {
            key,
            access,
            iova: staged().iova,
            length: staged().length,
        }
    }

    fn staged() -> Staged {
        // 3 pages of 4 KiB, the region 100 bytes into the first, 10,000 bytes long.
        Staged {
            iova: 0xffff_8880_0010_0064,
            length: 10_000,
            page_size: 4096,
            pages: 3,
        }
    }

    #[test]
    fn registers_with_a_new_key_byte() {
        let r = judge_reg(&free(), PD, &wr(0x1234_5602, LW | RW | RR), &staged()).unwrap();
        assert_eq!(r.key, 0x1234_5602);
        assert_eq!(r.map, staged());
    }

    #[test]
    fn refuses_what_rxe_refuses() {
        let s = staged();
        // Another MR's index.
        assert_eq!(
            judge_reg(&free(), PD, &wr(0x1234_5702, LW), &s),
            Err(FrwrError::Key)
        );
        assert_eq!(
            judge_reg(&free(), 8, &wr(0x1234_5602, LW), &s),
            Err(FrwrError::Pd)
        );
        let mut valid = free();
        valid.reg = Some(judge_reg(&free(), PD, &wr(0x1234_5602, LW), &s).unwrap());
        assert_eq!(
            judge_reg(&valid, PD, &wr(0x1234_5603, LW), &s),
            Err(FrwrError::State)
        );
        // Remote write without local write; an unknown flag.
        assert_eq!(
            judge_reg(&free(), PD, &wr(0x1234_5602, RW), &s),
            Err(FrwrError::Rights)
        );
        assert_eq!(
            judge_reg(&free(), PD, &wr(0x1234_5602, LW | access::MW_BIND), &s),
            Err(FrwrError::Rights)
        );
    }

    #[test]
    fn the_mapping_must_cover_the_length() {
        // The whole of 3 pages from 100 bytes in: the most that fits.
        let mut s = staged();
        s.length = 3 * 4096 - 100;
        let mut w = wr(0x1234_5602, LW);
        w.length = s.length;
        assert!(judge_reg(&free(), PD, &w, &s).is_ok());
        // The request may not claim more than was mapped.
        w.length += 1;
        assert_eq!(judge_reg(&free(), PD, &w, &s), Err(FrwrError::Mapping));
        s.length += 1;
        assert_eq!(judge_reg(&free(), PD, &w, &s), Err(FrwrError::Mapping));
        let mut s = staged();
        s.pages = 9; // beyond max_pages
        assert_eq!(
            judge_reg(&free(), PD, &wr(0x1234_5602, LW), &s),
            Err(FrwrError::Mapping)
        );
        let mut s = staged();
        s.page_size = 3000;
        assert_eq!(
            judge_reg(&free(), PD, &wr(0x1234_5602, LW), &s),
            Err(FrwrError::Mapping)
        );
        let mut s = staged();
        s.pages = 0;
        assert_eq!(
            judge_reg(&free(), PD, &wr(0x1234_5602, LW), &s),
            Err(FrwrError::Mapping)
        );
    }

    #[test]
    fn a_renumbered_region_reaches_the_staged_bytes() {
        // xprtrdma: after mapping, the XID goes into the iova's upper half.
        let mut w = wr(0x1234_5602, LW | RR);
        w.iova = 0x427e_72c0_0000_0000 | (staged().iova & 0xffff_ffff);
        let r = judge_reg(&free(), PD, &w, &staged()).unwrap();
        assert_eq!(r.iova, w.iova);
        // The peer's addresses are the new ones; the bytes are where the old ones were.
        assert_eq!(r.locate(w.iova, 10, RR), Ok(100));
        assert_eq!(r.locate(staged().iova, 10, RR), Err(FrwrError::Bounds));
        assert_eq!(r.locate(w.iova + 5000, 8, RR), Ok(5100));
    }

    #[test]
    fn invalidate_needs_the_exact_key_and_the_pd() {
        let mr = free();
        assert_eq!(judge_invalidate(&mr, PD, mr.key), Ok(()));
        assert_eq!(judge_invalidate(&mr, PD, mr.key + 1), Err(FrwrError::Key));
        assert_eq!(judge_invalidate(&mr, 1, mr.key), Err(FrwrError::Pd));
    }

    #[test]
    fn accesses_are_bounded_and_split_at_pages() {
        let r = judge_reg(&free(), PD, &wr(0x1234_5602, LW | RR), &staged()).unwrap();
        let iova = staged().iova;
        // The whole region: 3996 bytes of page 0 (from 100), all of page 1, the rest of 2.
        let start = r.locate(iova, 10_000, RR).unwrap();
        assert_eq!(start, 100);
        let p: Vec<Piece> = r.pieces(start, 10_000).collect();
        assert_eq!(
            p,
            [
                Piece {
                    page: 0,
                    offset: 100,
                    len: 3996
                },
                Piece {
                    page: 1,
                    offset: 0,
                    len: 4096
                },
                Piece {
                    page: 2,
                    offset: 0,
                    len: 1908
                },
            ]
        );
        assert_eq!(r.locate(iova, 10_001, RR), Err(FrwrError::Bounds));
        assert_eq!(r.locate(iova - 1, 1, RR), Err(FrwrError::Bounds));
        assert_eq!(r.locate(iova + 9_999, 1, RR), Ok(100 + 9_999));
        assert_eq!(r.locate(iova, 8, RW), Err(FrwrError::Permission));
        assert_eq!(r.locate(u64::MAX, 2, 0), Err(FrwrError::Bounds));
        // An empty access touches nothing.
        assert_eq!(r.pieces(start, 0).count(), 0);
    }
}
