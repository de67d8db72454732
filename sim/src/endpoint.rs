// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! What the fabric carries and what a transport endpoint looks like to it.

use crate::baseline::BasePkt;
use metaroce_transport::congestion::RateAllocator;
use metaroce_transport::memory::{Access, AccessError, AtomicOp, Memory, Sge};

/// UDP destination port of every packet (RoCEv2's 4791; MetaRoCE's is 4793, which changes
/// nothing for the hash's spread).
pub const DPORT: u16 = 4791;

/// A datagram on the fabric.
#[derive(Debug)]
pub struct Packet {
    /// Sending and receiving host (set by the fabric from the endpoint that sent it).
    pub src: u32,
    pub dst: u32,
    /// Plane (NIC port) it leaves on.
    pub plane: u8,
    /// UDP source port: the flow's entropy, which the ECMP hash sees.
    pub sport: u16,
    /// Bytes on the wire (serialisation and queue accounting).
    pub wire: u32,
    pub ecn_capable: bool,
    /// CE-marked by a queue on the way.
    pub ce: bool,
    /// The sender's QP among the pair's (baselines; MetaRoCE's streams are in its header).
    pub qp: u16,
    pub body: Body,
}

#[derive(Debug)]
pub enum Body {
    /// A MetaRoCE datagram (UDP payload).
    Meta(Vec<u8>),
    /// A baseline model's packet.
    Base(BasePkt),
}

/// Memory that accepts every access and counts the bytes placed by remote writes: data is
/// not modelled, only how much of it arrived.
#[derive(Default, Debug)]
pub struct CountingMemory {
    pub written: u64,
}

impl Memory for CountingMemory {
    fn read_local(&mut self, _: u32, _: &Sge, _: u32, out: &mut [u8]) -> Result<(), AccessError> {
        out.fill(0);
        Ok(())
    }
    fn write_local(&mut self, _: u32, _: &Sge, _: u32, _: &[u8]) -> Result<(), AccessError> {
        Ok(())
    }
    fn check_remote(
        &mut self,
        _: u32,
        _: u32,
        _: u64,
        _: u32,
        _: Access,
    ) -> Result<(), AccessError> {
        Ok(())
    }
    fn write_remote(&mut self, _: u32, _: u32, _: u64, data: &[u8]) -> Result<(), AccessError> {
        self.written += data.len() as u64;
        Ok(())
    }
    fn read_remote(&mut self, _: u32, _: u32, _: u64, out: &mut [u8]) -> Result<(), AccessError> {
        out.fill(0);
        Ok(())
    }
    fn atomic(&mut self, _: u32, _: u32, _: u64, op: AtomicOp) -> Result<u64, AccessError> {
        Ok(op.apply(0))
    }
}

/// A host's state shared by all its endpoints.
pub struct HostCtx {
    /// Inbound capacity allocator (MetaRoCE's receiver-driven rate).
    pub alloc: RateAllocator,
    /// MetaRoCE's placement target: counts payload bytes placed.
    pub mem: CountingMemory,
    /// Payload bytes the baselines delivered (new data only).
    pub rx_bytes: u64,
}

/// Counters an endpoint reports at the end.
#[derive(Clone, Copy, Debug, Default)]
pub struct EndCounters {
    /// Data packets sent, retransmissions included.
    pub data_packets: u64,
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Messages that completed with an error.
    pub failed: u64,
}

/// One end of a host pair's connection (host `h` towards peer `p`): takes transfers to send,
/// packets and timeouts; gives packets, a deadline and finished transfers.
pub trait End {
    /// Queue a transfer of `bytes` to the peer (identified by `flow`) on QP `qp` of the pair.
    fn post(&mut self, now: u64, flow: u32, qp: u16, bytes: u64);
    fn on_packet(&mut self, now: u64, pkt: Packet, ctx: &mut HostCtx);
    fn on_timeout(&mut self, now: u64, ctx: &mut HostCtx);
    /// The next packet to send now, if any (`src`/`dst` are filled in by the fabric).
    fn poll_transmit(&mut self, now: u64, ctx: &mut HostCtx) -> Option<Packet>;
    /// When `on_timeout` should be called next.
    fn next_timeout(&self) -> Option<u64>;
    /// Transfers completed at the sender since the last call.
    fn take_done(&mut self, out: &mut Vec<u32>);
    fn counters(&self) -> EndCounters;
    /// A description of the endpoint's state for debugging (`METAROCE_SIM_DEBUG`).
    fn debug(&self) -> String {
        String::new()
    }
    /// Bytes of transport state the endpoint holds (0: not modelled).
    fn state_bytes(&self) -> u64 {
        0
    }
}
