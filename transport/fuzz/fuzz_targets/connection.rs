// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Feeds arbitrary datagrams (and timer ticks) to a connection that has work outstanding in
//! both roles; nothing may panic. Input: a sequence of records `[kind, len_hi, len_lo, bytes..]`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_transport::connection::{Arrival, Config, Connection};
use metaroce_transport::memory::{Access, AccessError, AtomicOp, Memory, SgList, Sge};
use metaroce_transport::stream::{RecvWqe, SendWqe, StreamConfig, WrOpcode};

/// One 64 KiB region at address 0 under key 1.
struct Mem(Vec<u8>);

impl Mem {
    fn range(&self, key: u32, va: u64, len: usize) -> Result<std::ops::Range<usize>, AccessError> {
        if key != 1 {
            return Err(AccessError::Key);
        }
        let s = usize::try_from(va).map_err(|_| AccessError::Bounds)?;
        let e = s.checked_add(len).ok_or(AccessError::Bounds)?;
        if e > self.0.len() {
            return Err(AccessError::Bounds);
        }
        Ok(s..e)
    }
}

impl Memory for Mem {
    fn read_local(
        &mut self,
        _qp: u32,
        sge: &Sge,
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        let r = self.range(
            sge.lkey,
            sge.addr.wrapping_add(u64::from(offset)),
            out.len(),
        )?;
        out.copy_from_slice(&self.0[r]);
        Ok(())
    }
    fn write_local(
        &mut self,
        _qp: u32,
        sge: &Sge,
        offset: u32,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let r = self.range(
            sge.lkey,
            sge.addr.wrapping_add(u64::from(offset)),
            data.len(),
        )?;
        self.0[r].copy_from_slice(data);
        Ok(())
    }
    fn check_remote(
        &mut self,
        _qp: u32,
        rkey: u32,
        va: u64,
        len: u32,
        _: Access,
    ) -> Result<(), AccessError> {
        self.range(rkey, va, len as usize).map(|_| ())
    }
    fn write_remote(
        &mut self,
        _qp: u32,
        rkey: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let r = self.range(rkey, va, data.len())?;
        self.0[r].copy_from_slice(data);
        Ok(())
    }
    fn read_remote(
        &mut self,
        _qp: u32,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        let r = self.range(rkey, va, out.len())?;
        out.copy_from_slice(&self.0[r]);
        Ok(())
    }
    fn atomic(&mut self, _qp: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        let r = self.range(rkey, va, 8)?;
        let old = u64::from_ne_bytes(self.0[r.clone()].try_into().unwrap());
        let new = op.apply(old);
        self.0[r].copy_from_slice(&new.to_ne_bytes());
        Ok(old)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut cfg = Config::new(7, 9);
    cfg.num_paths = 4;
    cfg.mtu = 256;
    let Ok(mut c) = Connection::<
        metaroce_transport::connection::Paths<4>,
        [metaroce_transport::stream::Stream; 2],
    >::new(cfg)
    .map(Box::new) else {
        return;
    };
    let s = c.open_stream(StreamConfig::new(1, 2)).unwrap();
    let mut mem = Mem(vec![0; 64 << 10]);
    let sgl = |addr, len| SgList::single(Sge { addr, len, lkey: 1 });
    for i in 0..2 {
        let _ = c.post_recv(
            s,
            RecvWqe {
                wr_id: i,
                local: sgl(4096 * i, 4096),
            },
        );
    }
    let now = 1_000u64;
    let _ = c.post_send(now, s, SendWqe::new(1, WrOpcode::Send, sgl(0, 1000)));
    let _ = c.post_send(
        now,
        s,
        SendWqe::new(2, WrOpcode::RdmaWrite, sgl(0, 700)).remote(0, 1),
    );
    let _ = c.post_send(
        now,
        s,
        SendWqe::new(3, WrOpcode::RdmaRead, sgl(8192, 600)).remote(0, 1),
    );
    let _ = c.post_send(
        now,
        s,
        SendWqe::new(4, WrOpcode::FetchAdd, sgl(16384, 8)).remote(64, 1),
    );
    let mut buf = vec![0u8; 1024];
    let mut now = now;
    let mut rest = data;
    while rest.len() >= 3 {
        let kind = rest[0];
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let pkt = &rest[3..3 + len];
        rest = &rest[3 + len..];
        now += u64::from(kind & 0x3f) * 7_919;
        let _ = c.handle_packet(
            now,
            pkt,
            Arrival {
                ecn_ce: kind & 0x40 != 0,
                rx_busy: kind & 0x01 != 0,
                src_port: 0xc000 | u16::from(kind),
            },
            &mut mem,
        );
        if kind & 0x80 != 0 {
            c.handle_timeout(now);
        }
        while c.poll_transmit(now, &mut buf, &mut mem).is_some() {}
        while c.poll_event().is_some() {}
        let _ = c.poll_timeout();
    }
});
