// SPDX-License-Identifier: GPL-2.0

//! The entries of the rings shared with userspace (`uapi/metaroce-abi.h`), as plain data: any
//! bit pattern is a value of each, so the kernel copies them out of user-writable memory whole
//! and judges them here ([`super::wqe`]). The module asserts at compile time that each has the
//! size and field offsets of the C header's struct (`drivers/sys/abi.rs`).

/// `METAROCE_RING_HDR_SIZE`: the ring header (producer and consumer indices) before entry 0.
pub const RING_HDR_SIZE: usize = 128;
/// `METAROCE_SEND_WQE_SIZE`: a send WQE of the smallest entry size.
pub const SEND_WQE_SIZE: usize = 256;
/// `METAROCE_SEND_WQE_DATA`: that WQE's SGE / inline area.
pub const SEND_WQE_DATA: usize = 192;
/// `METAROCE_MAX_SEND_SGE`: SGEs a send WQE of the smallest entry size holds.
pub const MAX_SEND_SGE: usize = SEND_WQE_DATA / 16;
/// `METAROCE_MAX_INLINE`: inline bytes a send WQE holds.
pub const MAX_INLINE: usize = SEND_WQE_DATA;
/// `METAROCE_RECV_WQE_SIZE`: a receive WQE of the smallest entry size.
pub const RECV_WQE_SIZE: usize = 128;
/// `METAROCE_MAX_RECV_SGE`: SGEs a receive WQE of the smallest entry size holds.
pub const MAX_RECV_SGE: usize = 7;
/// `METAROCE_MAX_SGE`: the most SGEs any WQE holds, in a ring whose entries are large enough
/// (their SGE array goes on to the end of the entry: [`send_entry_size`],
/// [`recv_entry_size`]).
pub const MAX_SGE: usize = 32;
/// Bytes of a send WQE before its SGE / inline area.
pub const SEND_WQE_HEADER: usize = SEND_WQE_SIZE - SEND_WQE_DATA;
/// Bytes of a receive WQE before its SGEs.
pub const RECV_WQE_HEADER: usize = RECV_WQE_SIZE - 16 * MAX_RECV_SGE;

/// The entry size of a send queue whose WQEs carry up to `max_sge` SGEs (at most
/// [`MAX_SGE`]): the smallest WQE, or larger by 16 bytes an SGE.
pub const fn send_entry_size(max_sge: u32) -> usize {
    entry_size(SEND_WQE_HEADER, SEND_WQE_SIZE, max_sge)
}

/// The entry size of a receive queue (RQ or SRQ) whose WQEs carry up to `max_sge` SGEs.
pub const fn recv_entry_size(max_sge: u32) -> usize {
    entry_size(RECV_WQE_HEADER, RECV_WQE_SIZE, max_sge)
}

/// `header` and 16 bytes for each of `max_sge` SGEs (at most [`MAX_SGE`]), at least `smallest`.
const fn entry_size(header: usize, smallest: usize, max_sge: u32) -> usize {
    let n = if (max_sge as usize) < MAX_SGE {
        max_sge as usize
    } else {
        MAX_SGE
    };
    let need = header + 16 * n;
    if need > smallest {
        need
    } else {
        smallest
    }
}

/// `struct metaroce_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct metaroce_send_wqe` (256 bytes) as the kernel copies it out of an entry of any
/// size: `data` is the C union of `sge[12]` and `inline_data[192]` and the SGEs that go on
/// past it in a larger entry, `MAX_SGE` in all, kept as bytes (zero beyond the entry);
/// [`SendWqe::sge`] reads the SGE view.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // The C header documents each field.
pub struct SendWqe {
    pub wr_id: u64,
    pub opcode: u32,
    pub send_flags: u32,
    pub num_sge: u32,
    pub inline_len: u32,
    pub imm_data: u32,
    pub reserved0: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub reserved1: u32,
    pub compare_add: u64,
    pub swap: u64,
    pub data: [u8; 16 * MAX_SGE],
}

impl Default for SendWqe {
    fn default() -> Self {
        SendWqe {
            wr_id: 0,
            opcode: 0,
            send_flags: 0,
            num_sge: 0,
            inline_len: 0,
            imm_data: 0,
            reserved0: 0,
            remote_addr: 0,
            rkey: 0,
            reserved1: 0,
            compare_add: 0,
            swap: 0,
            data: [0; 16 * MAX_SGE],
        }
    }
}

impl SendWqe {
    /// SGE `i` of the union's `sge` view (host byte order, as the C union is); None past it.
    pub fn sge(&self, i: usize) -> Option<Sge> {
        let b: &[u8; 16] = self
            .data
            .get(i.checked_mul(16)?..)?
            .get(..16)?
            .try_into()
            .ok()?;
        let [a0, a1, a2, a3, a4, a5, a6, a7, l0, l1, l2, l3, k0, k1, k2, k3] = *b;
        Some(Sge {
            addr: u64::from_ne_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            length: u32::from_ne_bytes([l0, l1, l2, l3]),
            lkey: u32::from_ne_bytes([k0, k1, k2, k3]),
        })
    }

    /// Writes SGE `i` into the `sge` view (what the provider does; for tests and fuzzing).
    pub fn set_sge(&mut self, i: usize, s: Sge) {
        if let Some(b) = i
            .checked_mul(16)
            .and_then(|at| self.data.get_mut(at..))
            .and_then(|d| d.get_mut(..16))
        {
            b[..8].copy_from_slice(&s.addr.to_ne_bytes());
            b[8..12].copy_from_slice(&s.length.to_ne_bytes());
            b[12..].copy_from_slice(&s.lkey.to_ne_bytes());
        }
    }
}

/// `struct metaroce_ud_av`: what a UD QP's send WQE holds in its 32 bytes from `remote_addr`
/// on (`METAROCE_UD_AV_OFFSET`), in place of the RDMA and atomic fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct UdAv {
    pub dgid: [u8; 16],
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    pub reserved: [u32; 2],
}

/// `METAROCE_UD_AV_OFFSET`.
pub const UD_AV_OFFSET: usize = 32;

impl SendWqe {
    /// The 32 bytes from `remote_addr` on, as the C struct has them in memory (host order).
    fn av_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.remote_addr.to_ne_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_ne_bytes());
        b[12..16].copy_from_slice(&self.reserved1.to_ne_bytes());
        b[16..24].copy_from_slice(&self.compare_add.to_ne_bytes());
        b[24..].copy_from_slice(&self.swap.to_ne_bytes());
        b
    }

    /// The UD view of those bytes.
    pub fn ud_av(&self) -> UdAv {
        let b = self.av_bytes();
        let word = |at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&b[..16]);
        UdAv {
            dgid,
            remote_qpn: word(16),
            remote_qkey: word(20),
            reserved: [word(24), word(28)],
        }
    }

    /// Writes `av` into those bytes (what the provider does; for tests and fuzzing).
    pub fn set_ud_av(&mut self, av: &UdAv) {
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&av.dgid);
        b[16..20].copy_from_slice(&av.remote_qpn.to_ne_bytes());
        b[20..24].copy_from_slice(&av.remote_qkey.to_ne_bytes());
        b[24..28].copy_from_slice(&av.reserved[0].to_ne_bytes());
        b[28..].copy_from_slice(&av.reserved[1].to_ne_bytes());
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_ne_bytes(w)
        };
        let u32_at = |at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        self.remote_addr = u64_at(0);
        self.rkey = u32_at(8);
        self.reserved1 = u32_at(12);
        self.compare_add = u64_at(16);
        self.swap = u64_at(24);
    }
}

/// `struct metaroce_recv_wqe` (128 bytes) as the kernel copies it out of an entry of any
/// size: its `sge[7]` and those that go on past it in a larger entry, `MAX_SGE` in all (zero
/// beyond the entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub num_sge: u32,
    pub reserved: u32,
    pub sge: [Sge; MAX_SGE],
}

/// `struct metaroce_cqe` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Cqe {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub reserved: [u8; 18],
}

impl Cqe {
    /// A completion with no data (errors, flushes).
    pub fn status_only(wr_id: u64, status: u32, opcode: u32, qp_num: u32) -> Self {
        Cqe {
            wr_id,
            status,
            opcode,
            qp_num,
            ..Default::default()
        }
    }
}

const _: () = assert!(core::mem::size_of::<Sge>() == 16);
const _: () = assert!(core::mem::size_of::<SendWqe>() == send_entry_size(MAX_SGE as u32));
const _: () = assert!(core::mem::offset_of!(SendWqe, data) == SEND_WQE_HEADER);
const _: () = assert!(core::mem::size_of::<RecvWqe>() == recv_entry_size(MAX_SGE as u32));
const _: () = assert!(core::mem::offset_of!(RecvWqe, sge) == RECV_WQE_HEADER);
const _: () = assert!(core::mem::size_of::<Cqe>() == 64);

const _: () = assert!(core::mem::offset_of!(SendWqe, remote_addr) == UD_AV_OFFSET);
const _: () = assert!(core::mem::offset_of!(SendWqe, data) - UD_AV_OFFSET == 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ud_av_round_trips_through_the_rdma_fields() {
        let av = UdAv {
            dgid: core::array::from_fn(|i| i as u8 + 1),
            remote_qpn: 0x0012_3456,
            remote_qkey: 0x1111_2222,
            reserved: [0, 7],
        };
        let mut w = SendWqe::default();
        w.set_ud_av(&av);
        assert_eq!(w.ud_av(), av);
        // The GID's first bytes are remote_addr's memory, as the C struct overlays them.
        assert_eq!(w.remote_addr.to_ne_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(w.swap.to_ne_bytes()[4..], 7u32.to_ne_bytes());
    }

    #[test]
    fn entry_sizes_grow_with_the_sges_past_the_smallest() {
        assert_eq!((send_entry_size(0), send_entry_size(12)), (256, 256));
        assert_eq!((send_entry_size(13), send_entry_size(32)), (272, 576));
        assert_eq!(send_entry_size(u32::MAX), 576);
        assert_eq!((recv_entry_size(1), recv_entry_size(7)), (128, 128));
        assert_eq!((recv_entry_size(8), recv_entry_size(32)), (144, 528));
    }

    #[test]
    fn sge_view_round_trips_and_ends_at_the_largest_entry() {
        let mut w = SendWqe::default();
        let s = Sge {
            addr: 0x0102_0304_0506_0708,
            length: 77,
            lkey: 0xdead_beef,
        };
        w.set_sge(MAX_SGE - 1, s);
        assert_eq!(w.sge(MAX_SGE - 1), Some(s));
        assert_eq!(w.sge(0), Some(Sge::default()));
        assert_eq!(w.sge(MAX_SGE), None);
        assert_eq!(w.sge(usize::MAX), None);
        w.set_sge(MAX_SGE, s); // past the largest entry: nothing happens
    }
}
