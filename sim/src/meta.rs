// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A MetaRoCE endpoint: the real transport's `Connection` (one per host pair and direction
//! of setup, one stream on it), its paths spread over the planes, WRITEs of at most `chunk`
//! bytes posted as the send queue takes them.

use crate::endpoint::{Body, End, EndCounters, HostCtx, Packet};
use metaroce_transport::congestion::{CcConfig, PACKET_OVERHEAD};
use metaroce_transport::connection::{Arrival, Config, Connection, Event, Paths};
use metaroce_transport::memory::{SgList, Sge};
use metaroce_transport::stream::{CqStatus, SendWqe, Stream, StreamConfig, StreamId, WrOpcode};
use metaroce_transport::zero::ZeroValid;
use std::collections::VecDeque;

/// A simulated connection with room for `N` paths.
pub type Conn<const N: usize> = Connection<Paths<N>, [Stream; 1]>;

/// Paths per connection on a fabric of `planes` planes: 16, or 8 per plane (up to 64), so
/// that each plane's traffic still spreads over several ECMP routes.
pub fn paths_for(planes: usize) -> usize {
    (8 * planes).clamp(16, 64)
}

/// The transport's settings in the simulator.
#[derive(Clone, Copy, Debug)]
pub struct MetaConfig {
    pub paths: u16,
    pub planes: u8,
    pub mtu: u32,
    /// Largest WRITE a transfer is cut into.
    pub chunk: u32,
    pub cc: CcConfig,
    /// RTO of a path without an RTT sample, ns.
    pub initial_rto_ns: u64,
    pub seed: u64,
}

impl MetaConfig {
    pub fn new(planes: usize, seed: u64) -> Self {
        MetaConfig {
            paths: paths_for(planes) as u16,
            planes: planes as u8,
            mtu: 4096,
            chunk: 1 << 20,
            cc: CcConfig::new(),
            initial_rto_ns: 200_000,
            seed,
        }
    }
}

fn conn_id(host: u32, peer: u32) -> u32 {
    (host << 16 | peer) + 1
}

/// A `T` allocated zeroed on the heap (a connection is far too large for the stack).
fn zeroed_box<T: ZeroValid>() -> Box<T> {
    // SAFETY: `T: ZeroValid`: all-zero bytes are a valid `T`, which the compiler checked down
    // to the primitives (see `metaroce_transport::zero`).
    unsafe { Box::<T>::new_zeroed().assume_init() }
}

pub struct MetaEnd<const N: usize> {
    conn: Box<Conn<N>>,
    stream: StreamId,
    /// Transfers not yet fully posted: (flow, bytes left to post).
    pending: VecDeque<(u32, u64)>,
    /// Posted WRITEs in order: (flow, last WRITE of the flow).
    posted: VecDeque<(u32, bool)>,
    next_wr: u64,
    done: Vec<u32>,
    buf: Vec<u8>,
    chunk: u32,
    failed: u64,
}

impl<const N: usize> MetaEnd<N> {
    pub fn new(mc: &MetaConfig, host: u32, peer: u32) -> Self {
        let mut c = Config::new(conn_id(host, peer), conn_id(peer, host));
        c.num_paths = mc.paths.min(N as u16);
        c.planes = mc.planes.max(1);
        c.mtu = mc.mtu;
        c.seed = crate::rng::mix(mc.seed ^ (u64::from(host) << 32 | u64::from(peer))) | 1;
        c.path.min_rto = 100_000;
        c.path.initial_rto = mc.initial_rto_ns;
        c.path.max_rto = 5_000_000;
        c.path.ack_delay = 5_000;
        c.stall_timeout = 2_000_000;
        c.cc = mc.cc;
        let mut conn = zeroed_box::<Conn<N>>();
        conn.reset(c).expect("connection config");
        let stream = conn
            .open_stream(StreamConfig::new(conn_id(host, peer), conn_id(peer, host)))
            .expect("stream");
        MetaEnd {
            conn,
            stream,
            pending: VecDeque::new(),
            posted: VecDeque::new(),
            next_wr: 0,
            done: Vec::new(),
            buf: vec![0; mc.mtu as usize + 256],
            chunk: mc.chunk,
            failed: 0,
        }
    }

    fn try_post(&mut self, now: u64) {
        while let Some(&mut (flow, ref mut left)) = self.pending.front_mut() {
            let len = (*left).min(u64::from(self.chunk)) as u32;
            let wqe = SendWqe::new(
                self.next_wr,
                WrOpcode::RdmaWrite,
                SgList::single(Sge {
                    addr: 0,
                    len,
                    lkey: 1,
                }),
            )
            .remote(0, 1);
            if self.conn.post_send(now, self.stream, wqe).is_err() {
                break;
            }
            self.next_wr += 1;
            *left -= u64::from(len);
            let last = *left == 0;
            self.posted.push_back((flow, last));
            if last {
                self.pending.pop_front();
            }
        }
    }

    fn drain(&mut self, now: u64) {
        while let Some(ev) = self.conn.poll_event() {
            if let Event::SendCompletion(c) = ev {
                let (flow, last) = self
                    .posted
                    .pop_front()
                    .expect("a completion for a posted WRITE");
                if c.status != CqStatus::Success {
                    self.failed += 1;
                }
                if last {
                    self.done.push(flow);
                }
            }
        }
        self.try_post(now);
    }
}

impl<const N: usize> End for MetaEnd<N> {
    fn post(&mut self, now: u64, flow: u32, bytes: u64) {
        self.pending.push_back((flow, bytes.max(1)));
        self.try_post(now);
    }

    fn on_packet(&mut self, now: u64, pkt: Packet, ctx: &mut HostCtx) {
        if let Body::Meta(bytes) = &pkt.body {
            let arrival = Arrival {
                ecn_ce: pkt.ce,
                src_port: pkt.sport,
            };
            let _ = self.conn.handle_packet(now, bytes, arrival, &mut ctx.mem);
        }
        self.drain(now);
    }

    fn on_timeout(&mut self, now: u64, _ctx: &mut HostCtx) {
        self.conn.handle_timeout(now);
        self.drain(now);
    }

    fn poll_transmit(&mut self, now: u64, ctx: &mut HostCtx) -> Option<Packet> {
        self.conn.update_allocation(now, &mut ctx.alloc);
        let t = self.conn.poll_transmit(now, &mut self.buf, &mut ctx.mem)?;
        Some(Packet {
            src: 0,
            dst: 0,
            plane: t.plane,
            sport: t.src_port,
            wire: t.len as u32 + PACKET_OVERHEAD,
            ecn_capable: t.ecn_capable,
            ce: false,
            body: Body::Meta(self.buf[..t.len].to_vec()),
        })
    }

    fn next_timeout(&self) -> Option<u64> {
        self.conn.poll_timeout()
    }

    fn take_done(&mut self, out: &mut Vec<u32>) {
        out.append(&mut self.done);
    }

    fn debug(&self) -> String {
        let mut out = format!("{:?}\n", self.conn.stats());
        for i in 0..self.conn.path_count() {
            if let (Some(st), Some(ps)) = (self.conn.path_state(i), self.conn.path_stats(i)) {
                out += &format!("  path {i}: {st:?} {ps:?}\n");
            }
        }
        if let Some((r, q)) = self.conn.stream_stats(self.stream) {
            out += &format!("  requester {r:?}\n  responder {q:?}\n");
        }
        out
    }

    fn counters(&self) -> EndCounters {
        let s = self.conn.stats();
        EndCounters {
            data_packets: s.data_packets_out,
            retransmits: s.retransmits,
            timeouts: s.timeouts,
            failed: self.failed,
        }
    }
}
