// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The direct verbs (`metaroce_dv.h`), their safe part: the driver command the kernel module
//! reads, the size of the response buffer, and checking the kernel's response and turning it
//! into the caller's `struct metaroce_dv_qp_info` / `struct metaroce_dv_path`; and describing
//! a QP's mapped rings as `struct metaroce_dv_qp_rings` (`metaroce_dv_qp_rings`).
//!
//! Both verbs are one extended modify_qp (`ibv_cmd_modify_qp_ex`, attr_mask 0) whose request
//! is `struct metaroce_cmd_modify_qp` (the core `ibv_modify_qp_ex`, then our
//! `metaroce_modify_qp_cmd`) and whose response is `struct metaroce_cmd_modify_qp_resp` (the
//! core `ib_uverbs_ex_modify_qp_resp`, then our `metaroce_modify_qp_resp`) followed by room for
//! `metaroce_path_info` entries; see `src/wrapper.h` and `uapi/metaroce-abi.h`.

use crate::ffi::sys;
use crate::ring::{Geometry, CONSUMER_OFFSET, HDR_SIZE, PRODUCER_OFFSET};
use core::ffi::c_int;
use core::mem::{offset_of, size_of};

/// The most paths a connection has (`METAROCE_DV_MAX_PATHS`): the response never needs room
/// for more.
pub const MAX_PATHS: u32 = sys::METAROCE_DV_MAX_PATHS;

/// Bytes of the fixed driver response (`struct metaroce_modify_qp_resp` without `paths[]`).
const DRV_FIXED: usize = size_of::<sys::metaroce_modify_qp_resp>();
/// Bytes of one `paths[]` entry.
const PATH_SIZE: usize = size_of::<sys::metaroce_path_info>();

/// Where `paths[]` starts in the response buffer.
pub const PATHS_OFFSET: usize = offset_of!(sys::metaroce_cmd_modify_qp_resp, drv_payload)
    + offset_of!(sys::metaroce_modify_qp_resp, paths);

// The uverbs _ex write protocol counts the driver part of request and response in words of 8
// bytes (provider_in_words / provider_out_words), so every size here must be a multiple of 8;
// the buffer is a Vec<u64>, whose alignment suits every field.
const _: () = assert!(DRV_FIXED.is_multiple_of(8) && PATH_SIZE.is_multiple_of(8));
const _: () = assert!(size_of::<sys::metaroce_modify_qp_cmd>().is_multiple_of(8));
const _: () = assert!(PATHS_OFFSET == size_of::<sys::metaroce_cmd_modify_qp_resp>());
const _: () = assert!(align_of::<sys::metaroce_cmd_modify_qp_resp>() <= align_of::<u64>());
const _: () = assert!(align_of::<sys::metaroce_path_info>() <= align_of::<u64>());
const _: () = assert!(size_of::<sys::metaroce_dv_path>() == PATH_SIZE);

/// The driver command of a query (changes nothing).
pub fn query_cmd() -> sys::metaroce_modify_qp_cmd {
    sys::metaroce_modify_qp_cmd {
        comp_mask: 0,
        plane_mask: 0,
        reserved: 0,
    }
}

/// The driver command restricting a QP to `plane_mask`.
pub fn set_planes_cmd(plane_mask: u32) -> sys::metaroce_modify_qp_cmd {
    sys::metaroce_modify_qp_cmd {
        comp_mask: sys::metaroce_modify_qp_comp_mask_METAROCE_MODIFY_QP_PLANES,
        plane_mask,
        reserved: 0,
    }
}

/// How many `paths[]` entries to make room for, for a caller's array of `capacity`.
pub fn path_room(capacity: u32) -> usize {
    capacity.min(MAX_PATHS) as usize
}

/// Bytes of the whole response buffer (core response, ours, `entries` paths): the
/// `resp_size` of `ibv_cmd_modify_qp_ex`, a multiple of 8.
pub fn resp_size(entries: usize) -> usize {
    PATHS_OFFSET + entries * PATH_SIZE
}

/// What is wrong with a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespError {
    /// The kernel wrote no driver response: it does not know the direct verbs (a module
    /// without them ignores our driver data and answers a plain modify_qp).
    NotAnswered,
    /// The response contradicts itself or the room it was given.
    Malformed,
}

impl RespError {
    /// The errno the verbs return for it.
    pub fn errno(self) -> c_int {
        match self {
            RespError::NotAnswered => sys::EOPNOTSUPP as c_int,
            RespError::Malformed => sys::EPROTO as c_int,
        }
    }
}

/// Checks the driver response of a call that gave room for `room` paths; returns how many
/// `paths[]` entries it holds.
pub fn check_resp(resp: &sys::metaroce_modify_qp_resp, room: usize) -> Result<usize, RespError> {
    let len = resp.response_length as usize;
    if len < DRV_FIXED {
        return Err(RespError::NotAnswered);
    }
    let n = resp.num_path_info as usize;
    if n > room || n > resp.num_paths as usize || len < DRV_FIXED + n * PATH_SIZE {
        return Err(RespError::Malformed);
    }
    Ok(n)
}

/// `struct metaroce_dv_qp_info` for a checked response: the caller's `paths` pointer kept,
/// `num_path_entries` = `filled`, no optional field filled (`comp_mask` 0).
pub fn qp_info(
    resp: &sys::metaroce_modify_qp_resp,
    filled: usize,
    paths: *mut sys::metaroce_dv_path,
) -> sys::metaroce_dv_qp_info {
    sys::metaroce_dv_qp_info {
        plane_mask: resp.plane_mask,
        connected: resp.connected,
        planes: resp.planes,
        planes_up: resp.planes_up,
        num_paths: resp.num_paths,
        qps: resp.qps,
        // filled <= room <= MAX_PATHS.
        num_path_entries: filled as u32,
        comp_mask: 0,
        paths,
    }
}

/// One `paths[]` entry as the caller's `struct metaroce_dv_path`.
pub fn dv_path(p: &sys::metaroce_path_info) -> sys::metaroce_dv_path {
    sys::metaroce_dv_path {
        path_id: p.path_id,
        plane: p.plane,
        state: p.state,
        udp_sport: p.udp_sport,
        reserved0: 0,
        srtt_us: p.srtt_us,
        cwnd: p.cwnd,
        in_flight: p.in_flight,
        reserved1: 0,
        packets_sent: p.packets_sent,
        retransmits: p.retransmits,
        ecn_marks: p.ecn_marks,
        timeouts: p.timeouts,
    }
}

/// `struct metaroce_dv_ring` for a ring whose mapping starts at `base` (its header), with
/// geometry `geo`. Address arithmetic only: nothing is read or written.
pub fn dv_ring(base: *mut u8, geo: &Geometry) -> sys::metaroce_dv_ring {
    sys::metaroce_dv_ring {
        buf: base.wrapping_add(HDR_SIZE).cast(),
        // A checked geometry's stride is the ABI's u32 entry_size.
        entry_size: geo.stride as u32,
        num_entries: geo.num_entries,
        producer: base.wrapping_add(PRODUCER_OFFSET).cast(),
        consumer: base.wrapping_add(CONSUMER_OFFSET).cast(),
    }
}

/// The `struct metaroce_dv_ring` of a queue the QP does not have (an RQ replaced by an SRQ):
/// all zero.
pub fn no_ring() -> sys::metaroce_dv_ring {
    sys::metaroce_dv_ring {
        buf: core::ptr::null_mut(),
        entry_size: 0,
        num_entries: 0,
        producer: core::ptr::null_mut(),
        consumer: core::ptr::null_mut(),
    }
}

/// `struct metaroce_dv_qp_rings` for a QP's SQ and RQ (None: the QP has none); no optional
/// field filled (`comp_mask` 0).
pub fn qp_rings(
    sq: Option<sys::metaroce_dv_ring>,
    rq: Option<sys::metaroce_dv_ring>,
) -> sys::metaroce_dv_qp_rings {
    sys::metaroce_dv_qp_rings {
        comp_mask: 0,
        reserved: 0,
        sq: sq.unwrap_or_else(no_ring),
        rq: rq.unwrap_or_else(no_ring),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(
        response_length: usize,
        num_paths: u32,
        num_path_info: u32,
    ) -> sys::metaroce_modify_qp_resp {
        sys::metaroce_modify_qp_resp {
            response_length: response_length as u32,
            plane_mask: 0x5,
            connected: 1,
            planes: 3,
            planes_up: 0x7,
            num_paths,
            qps: 2,
            num_path_info,
            paths: sys::__IncompleteArrayField::new(),
        }
    }

    fn path(i: u16) -> sys::metaroce_path_info {
        sys::metaroce_path_info {
            path_id: i,
            plane: (i % 3) as u8,
            state: sys::metaroce_path_state_METAROCE_PATH_PROBING as u8,
            udp_sport: 49152 + i,
            reserved: 0xffff,
            srtt_us: 120 + u32::from(i),
            cwnd: 64,
            in_flight: 3,
            reserved1: 0xffff_ffff,
            packets_sent: 1 << 40,
            retransmits: 7,
            ecn_marks: 9,
            timeouts: 1,
        }
    }

    #[test]
    fn command_layout_is_what_declare_drv_cmd_gives() {
        type C = sys::metaroce_cmd_modify_qp;
        type D = sys::metaroce_modify_qp_cmd;
        // The core request: the _ex header and ib_uverbs_ex_modify_qp, in 8-byte words.
        assert_eq!(size_of::<sys::ex_hdr>(), 24);
        assert_eq!(size_of::<sys::ib_uverbs_ex_modify_qp>(), 120);
        assert_eq!(size_of::<sys::ibv_modify_qp_ex>(), 24 + 120);
        // Ours follows it directly and ends the request, no padding.
        assert_eq!(
            offset_of!(C, drv_payload),
            size_of::<sys::ibv_modify_qp_ex>()
        );
        assert_eq!(
            size_of::<C>(),
            size_of::<sys::ibv_modify_qp_ex>() + size_of::<D>()
        );
        assert_eq!(size_of::<D>(), 16);
        assert_eq!(
            (
                offset_of!(D, comp_mask),
                offset_of!(D, plane_mask),
                offset_of!(D, reserved)
            ),
            (0, 4, 8)
        );
    }

    #[test]
    fn response_layout_is_what_declare_drv_cmd_gives() {
        type R = sys::metaroce_cmd_modify_qp_resp;
        type D = sys::metaroce_modify_qp_resp;
        assert_eq!(size_of::<sys::ib_uverbs_ex_modify_qp_resp>(), 8);
        assert_eq!(offset_of!(R, drv_payload), 8);
        assert_eq!(size_of::<D>(), 32);
        assert_eq!(size_of::<R>(), 40);
        assert_eq!(offset_of!(D, response_length), 0);
        assert_eq!(offset_of!(D, plane_mask), 4);
        assert_eq!(offset_of!(D, num_paths), 20);
        assert_eq!(offset_of!(D, num_path_info), 28);
        assert_eq!(offset_of!(D, paths), 32);
        assert_eq!(PATHS_OFFSET, 40);
        type P = sys::metaroce_path_info;
        assert_eq!(size_of::<P>(), 56);
        assert_eq!(offset_of!(P, udp_sport), 4);
        assert_eq!(offset_of!(P, srtt_us), 8);
        assert_eq!(offset_of!(P, in_flight), 16);
        assert_eq!(offset_of!(P, packets_sent), 24);
        assert_eq!(offset_of!(P, timeouts), 48);
    }

    #[test]
    fn public_structs_match_the_kernel_abi() {
        type V = sys::metaroce_dv_path;
        type P = sys::metaroce_path_info;
        assert_eq!(size_of::<V>(), size_of::<P>());
        assert_eq!(offset_of!(V, plane), offset_of!(P, plane));
        assert_eq!(offset_of!(V, state), offset_of!(P, state));
        assert_eq!(offset_of!(V, udp_sport), offset_of!(P, udp_sport));
        assert_eq!(offset_of!(V, srtt_us), offset_of!(P, srtt_us));
        assert_eq!(offset_of!(V, packets_sent), offset_of!(P, packets_sent));
        assert_eq!(offset_of!(V, timeouts), offset_of!(P, timeouts));
        for (dv, kernel) in [
            (
                sys::metaroce_dv_path_state_METAROCE_DV_PATH_ACTIVE,
                sys::metaroce_path_state_METAROCE_PATH_ACTIVE,
            ),
            (
                sys::metaroce_dv_path_state_METAROCE_DV_PATH_SUSPECT,
                sys::metaroce_path_state_METAROCE_PATH_SUSPECT,
            ),
            (
                sys::metaroce_dv_path_state_METAROCE_DV_PATH_FAILED,
                sys::metaroce_path_state_METAROCE_PATH_FAILED,
            ),
            (
                sys::metaroce_dv_path_state_METAROCE_DV_PATH_PROBING,
                sys::metaroce_path_state_METAROCE_PATH_PROBING,
            ),
        ] {
            assert_eq!(dv, kernel);
        }
        // struct metaroce_dv_qp_info: seven u32, comp_mask, then the pointer; no padding.
        type I = sys::metaroce_dv_qp_info;
        assert_eq!(offset_of!(I, num_path_entries), 24);
        assert_eq!(offset_of!(I, comp_mask), 28);
        assert_eq!(offset_of!(I, paths), 32);
        assert_eq!(size_of::<I>(), 40);
    }

    #[test]
    fn commands() {
        let q = query_cmd();
        assert_eq!((q.comp_mask, q.plane_mask, q.reserved), (0, 0, 0));
        let s = set_planes_cmd(0b101);
        assert_eq!((s.comp_mask, s.plane_mask, s.reserved), (1, 0b101, 0));
        assert_eq!(set_planes_cmd(0).comp_mask, 1); // 0 = every plane is a setting too
    }

    #[test]
    fn buffer_sizes() {
        assert_eq!(path_room(0), 0);
        assert_eq!(path_room(3), 3);
        assert_eq!(path_room(256), 256);
        assert_eq!(path_room(257), 256);
        assert_eq!(path_room(u32::MAX), 256);
        assert_eq!(resp_size(0), 40);
        assert_eq!(resp_size(1), 96);
        assert_eq!(resp_size(256), 40 + 256 * 56);
        for n in [0, 1, 2, 3, 255, 256] {
            let size = resp_size(n);
            assert!(size.is_multiple_of(8), "{n} entries: {size} bytes");
            // What libibverbs then tells the kernel: out_words (core) and provider_out_words.
            let core = size_of::<sys::ib_uverbs_ex_modify_qp_resp>();
            assert_eq!(
                (size - core) / 8 * 8,
                size_of::<sys::metaroce_modify_qp_resp>() + n * 56
            );
        }
    }

    #[test]
    fn checks_the_response() {
        // Not connected: only the fixed part.
        let mut r = resp(32, 0, 0);
        r.connected = 0;
        assert_eq!(check_resp(&r, 0), Ok(0));
        assert_eq!(check_resp(&r, 256), Ok(0));
        // Connected, all paths fit.
        assert_eq!(check_resp(&resp(32 + 4 * 56, 4, 4), 4), Ok(4));
        assert_eq!(check_resp(&resp(32 + 4 * 56, 4, 4), 256), Ok(4));
        // Fewer entries than paths: the room given.
        assert_eq!(check_resp(&resp(32 + 2 * 56, 4, 2), 2), Ok(2));
        // A kernel without the direct verbs leaves the zeroed buffer as it is.
        assert_eq!(check_resp(&resp(0, 0, 0), 8), Err(RespError::NotAnswered));
        assert_eq!(check_resp(&resp(31, 0, 0), 8), Err(RespError::NotAnswered));
        // More entries than the room, than the paths, or than the length says.
        assert_eq!(
            check_resp(&resp(32 + 3 * 56, 4, 3), 2),
            Err(RespError::Malformed)
        );
        assert_eq!(
            check_resp(&resp(32 + 3 * 56, 2, 3), 4),
            Err(RespError::Malformed)
        );
        assert_eq!(
            check_resp(&resp(32 + 2 * 56, 4, 3), 4),
            Err(RespError::Malformed)
        );
        assert_eq!(
            check_resp(&resp(32, 4, u32::MAX), 256),
            Err(RespError::Malformed)
        );
        assert_eq!(RespError::NotAnswered.errno(), 95);
        assert_eq!(RespError::Malformed.errno(), 71);
    }

    #[test]
    fn converts_the_response() {
        let r = resp(32 + 2 * 56, 4, 2);
        let mut dst = [dv_path(&path(0)); 2];
        let info = qp_info(&r, 2, dst.as_mut_ptr());
        assert_eq!(
            (
                info.plane_mask,
                info.connected,
                info.planes,
                info.planes_up,
                info.num_paths,
                info.qps
            ),
            (0x5, 1, 3, 0x7, 4, 2)
        );
        assert_eq!((info.num_path_entries, info.comp_mask), (2, 0));
        assert_eq!(info.paths, dst.as_mut_ptr());

        let p = dv_path(&path(5));
        assert_eq!((p.path_id, p.plane, p.udp_sport), (5, 2, 49157));
        assert_eq!(
            u32::from(p.state),
            sys::metaroce_dv_path_state_METAROCE_DV_PATH_PROBING
        );
        assert_eq!((p.srtt_us, p.cwnd, p.in_flight), (125, 64, 3));
        assert_eq!(
            (p.packets_sent, p.retransmits, p.ecn_marks, p.timeouts),
            (1 << 40, 7, 9, 1)
        );
        // The kernel's reserved fields are not passed on.
        assert_eq!((p.reserved0, p.reserved1), (0, 0));
    }

    #[test]
    fn public_ring_entries_match_the_kernel_abi() {
        type S = sys::metaroce_dv_send_wqe;
        type K = sys::metaroce_send_wqe;
        assert_eq!(size_of::<S>(), size_of::<K>());
        assert_eq!(size_of::<S>(), sys::METAROCE_DV_SEND_WQE_SIZE as usize);
        assert_eq!(size_of::<K>(), sys::METAROCE_SEND_WQE_SIZE as usize);
        assert_eq!(align_of::<S>(), align_of::<K>());
        for (dv, kernel) in [
            (offset_of!(S, wr_id), offset_of!(K, wr_id)),
            (offset_of!(S, opcode), offset_of!(K, opcode)),
            (offset_of!(S, send_flags), offset_of!(K, send_flags)),
            (offset_of!(S, num_sge), offset_of!(K, num_sge)),
            (offset_of!(S, inline_len), offset_of!(K, inline_len)),
            (offset_of!(S, imm_data), offset_of!(K, imm_data)),
            (offset_of!(S, reserved0), offset_of!(K, reserved0)),
            (offset_of!(S, remote_addr), offset_of!(K, remote_addr)),
            (offset_of!(S, rkey), offset_of!(K, rkey)),
            (offset_of!(S, reserved1), offset_of!(K, reserved1)),
            (offset_of!(S, compare_add), offset_of!(K, compare_add)),
            (offset_of!(S, swap), offset_of!(K, swap)),
            (offset_of!(S, data), offset_of!(K, data)),
        ] {
            assert_eq!(dv, kernel);
        }
        assert_eq!(offset_of!(S, data), 64);
        assert_eq!(sys::METAROCE_DV_MAX_SEND_SGE, sys::METAROCE_MAX_SEND_SGE);
        assert_eq!(sys::METAROCE_DV_MAX_INLINE, sys::METAROCE_MAX_INLINE);

        type R = sys::metaroce_dv_recv_wqe;
        type KR = sys::metaroce_recv_wqe;
        assert_eq!(size_of::<R>(), size_of::<KR>());
        assert_eq!(size_of::<R>(), sys::METAROCE_DV_RECV_WQE_SIZE as usize);
        assert_eq!(size_of::<KR>(), sys::METAROCE_RECV_WQE_SIZE as usize);
        assert_eq!(offset_of!(R, num_sge), offset_of!(KR, num_sge));
        assert_eq!(offset_of!(R, reserved), offset_of!(KR, reserved));
        assert_eq!(offset_of!(R, sge), offset_of!(KR, sge));
        assert_eq!(sys::METAROCE_DV_MAX_RECV_SGE, sys::METAROCE_MAX_RECV_SGE);
        assert_eq!(sys::METAROCE_DV_MAX_SGE, sys::METAROCE_MAX_SGE);

        type G = sys::metaroce_dv_sge;
        type KG = sys::metaroce_sge;
        assert_eq!(size_of::<G>(), size_of::<KG>());
        assert_eq!(offset_of!(G, length), offset_of!(KG, length));
        assert_eq!(offset_of!(G, lkey), offset_of!(KG, lkey));

        // struct metaroce_dv_qp_rings: comp_mask, reserved, then the two rings (each a
        // pointer, two u32 and two pointers).
        type D = sys::metaroce_dv_ring;
        assert_eq!(size_of::<D>(), 32);
        assert_eq!(offset_of!(D, entry_size), 8);
        assert_eq!(offset_of!(D, producer), 16);
        assert_eq!(offset_of!(D, consumer), 24);
        type Q = sys::metaroce_dv_qp_rings;
        assert_eq!(
            (offset_of!(Q, sq), offset_of!(Q, rq), size_of::<Q>()),
            (8, 40, 72)
        );
    }

    #[test]
    fn describes_a_mapped_ring() {
        let info = sys::metaroce_mmap_info {
            offset: 8192,
            length: 4096,
            num_entries: 16,
            entry_size: 128,
        };
        let geo = Geometry::new(&info, size_of::<sys::metaroce_recv_wqe>()).unwrap();
        let mut mapping = vec![0u64; 4096 / 8];
        let base = mapping.as_mut_ptr().cast::<u8>();
        // (Writing through the pointers: ffi's tests, on a QP.)
        let r = dv_ring(base, &geo);
        assert_eq!(r.buf as usize, base as usize + 128);
        assert_eq!(r.producer as usize, base as usize);
        assert_eq!(r.consumer as usize, base as usize + 64);
        assert_eq!((r.entry_size, r.num_entries), (128, 16));
        let both = qp_rings(Some(r), None);
        assert_eq!((both.comp_mask, both.reserved), (0, 0));
        assert_eq!(both.sq.buf, r.buf);
        assert!(both.rq.buf.is_null() && both.rq.producer.is_null() && both.rq.consumer.is_null());
        assert_eq!((both.rq.entry_size, both.rq.num_entries), (0, 0));
    }
}
