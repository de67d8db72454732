// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A MetaRoCE endpoint: the real transport's `Connection` (one per host pair and direction
//! of setup, a stream per QP on it: one, or `qps` in growable storage), its paths spread over
//! the planes, WRITEs of at most `chunk` bytes posted as each send queue takes them.

use crate::endpoint::{Body, End, EndCounters, HostCtx, Packet};
use metaroce_transport::congestion::{CcConfig, PACKET_OVERHEAD};
use metaroce_transport::connection::{Arrival, Config, Connection, Event, Paths, StreamSlots};
use metaroce_transport::memory::{SgList, Sge};
use metaroce_transport::stream::{CqStatus, SendWqe, Stream, StreamConfig, StreamId, WrOpcode};
use metaroce_transport::zero::ZeroValid;
use std::collections::VecDeque;

/// A simulated connection with room for `N` paths and one stream.
pub type Conn<const N: usize> = Connection<Paths<N>, [Stream; 1]>;

/// Stream storage whose allocated size can be told (the state a connection holds).
pub trait SizedSlots: StreamSlots + ZeroValid {
    /// Bytes held outside the connection itself.
    fn extra_bytes(&self) -> usize;
}

impl SizedSlots for [Stream; 1] {
    fn extra_bytes(&self) -> usize {
        0
    }
}

impl SizedSlots for crate::slots::Slots {
    fn extra_bytes(&self) -> usize {
        self.bytes()
    }
}

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
    /// Streams (QPs) per connection.
    pub qps: u16,
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
            qps: 1,
        }
    }
}

fn conn_id(host: u32, peer: u32) -> u32 {
    (host << 16 | peer) + 1
}

/// QP number of stream `qp` of host `host`'s connection to `peer`.
fn qpn(host: u32, peer: u32, qp: u16) -> u32 {
    conn_id(host, peer).wrapping_add(u32::from(qp) << 22)
}

/// A `T` allocated zeroed on the heap (a connection is far too large for the stack).
pub fn zeroed_box<T: ZeroValid>() -> Box<T> {
    // SAFETY: `T: ZeroValid`: all-zero bytes are a valid `T`, which the compiler checked down
    // to the primitives (see `metaroce_transport::zero`).
    unsafe { Box::<T>::new_zeroed().assume_init() }
}

pub struct MetaEnd<const N: usize, S: SizedSlots = [Stream; 1]> {
    conn: Box<Connection<Paths<N>, S>>,
    /// The streams by QP index, and the QP index of each stream id.
    streams: Vec<StreamId>,
    qp_of: Vec<u16>,
    /// Per QP: transfers not yet fully posted: (flow, bytes left to post).
    pending: Vec<VecDeque<(u32, u64)>>,
    /// Per QP: posted WRITEs in order: (flow, last WRITE of the flow).
    posted: Vec<VecDeque<(u32, bool)>>,
    /// QPs that may post again (a completion or room in their send queue).
    touched: Vec<u16>,
    next_wr: u64,
    done: Vec<u32>,
    buf: Vec<u8>,
    chunk: u32,
    failed: u64,
}

impl<const N: usize, S: SizedSlots> MetaEnd<N, S> {
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
        // The fabric's paths are FIFO (reordering within a path needs a route change) and its
        // base RTTs are 4-9 us (1 us per link, two or four links each way): a floor of 3 us,
        // not the transport's default 10 us (sized for software stacks, where srtt / 4 is
        // above it anyway), keeps loss detection within about a round trip.
        c.path.min_reorder_window = 3_000;
        c.stall_timeout = 2_000_000;
        c.cc = mc.cc;
        let mut conn = zeroed_box::<Connection<Paths<N>, S>>();
        conn.reset(c).expect("connection config");
        let qps = mc.qps.max(1);
        let streams: Vec<StreamId> = (0..qps)
            .map(|q| {
                conn.open_stream(StreamConfig::new(qpn(host, peer, q), qpn(peer, host, q)))
                    .expect("stream")
            })
            .collect();
        let mut qp_of = vec![
            0;
            streams
                .iter()
                .map(|s| usize::from(s.0) + 1)
                .max()
                .unwrap_or(0)
        ];
        for (q, s) in streams.iter().enumerate() {
            qp_of[usize::from(s.0)] = q as u16;
        }
        MetaEnd {
            conn,
            streams,
            qp_of,
            pending: vec![VecDeque::new(); usize::from(qps)],
            posted: vec![VecDeque::new(); usize::from(qps)],
            touched: Vec::new(),
            next_wr: 0,
            done: Vec::new(),
            buf: vec![0; mc.mtu as usize + 256],
            chunk: mc.chunk,
            failed: 0,
        }
    }

    /// Posts QP `q`'s transfers while its send queue takes them.
    fn try_post(&mut self, now: u64, q: usize) {
        let stream = self.streams[q];
        while let Some(&mut (flow, ref mut left)) = self.pending[q].front_mut() {
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
            if self.conn.post_send(now, stream, wqe).is_err() {
                break;
            }
            self.next_wr += 1;
            *left -= u64::from(len);
            let last = *left == 0;
            self.posted[q].push_back((flow, last));
            if last {
                self.pending[q].pop_front();
            }
        }
    }

    fn drain(&mut self, now: u64) {
        while let Some(ev) = self.conn.poll_event() {
            let stream = match ev {
                Event::SendCompletion(c) => {
                    let q = usize::from(self.qp_of[usize::from(c.stream.0)]);
                    let (flow, last) = self.posted[q]
                        .pop_front()
                        .expect("a completion for a posted WRITE");
                    if c.status != CqStatus::Success {
                        self.failed += 1;
                    }
                    if last {
                        self.done.push(flow);
                    }
                    c.stream
                }
                Event::SendQueueRoom(s) => s,
                _ => continue,
            };
            if self.streams.len() > 1 {
                self.touched.push(self.qp_of[usize::from(stream.0)]);
            }
        }
        if self.streams.len() == 1 {
            self.try_post(now, 0);
        }
        while let Some(q) = self.touched.pop() {
            self.try_post(now, usize::from(q));
        }
    }
}

impl<const N: usize, S: SizedSlots> End for MetaEnd<N, S> {
    fn post(&mut self, now: u64, flow: u32, qp: u16, bytes: u64) {
        let q = usize::from(qp) % self.streams.len();
        self.pending[q].push_back((flow, bytes.max(1)));
        self.try_post(now, q);
    }

    fn on_packet(&mut self, now: u64, pkt: Packet, ctx: &mut HostCtx) {
        if let Body::Meta(bytes) = &pkt.body {
            let arrival = Arrival {
                ecn_ce: pkt.ce,
                rx_busy: false,
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
            qp: 0,
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
        for &s in &self.streams {
            if let Some((r, q)) = self.conn.stream_stats(s) {
                out += &format!("  requester {r:?}\n  responder {q:?}\n");
            }
        }
        out
    }

    fn state_bytes(&self) -> u64 {
        (std::mem::size_of::<Connection<Paths<N>, S>>() + self.conn.streams().extra_bytes()) as u64
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
