// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Rough CPU cost of the core per datagram, without the simulator's overheads: two
//! connections wired back to back (no loss, zero delay), bulk 4 KiB WRITEs. For instruction
//! counts (deterministic, so an A/B of one change): `valgrind --tool=callgrind` on the test
//! binary with `--ignored`.
//! `cargo test --release -p metaroce-transport --test bench -- --ignored --nocapture`

mod sim;

use metaroce_transport::connection::Event;
use metaroce_transport::stream::{SendWqe, StreamConfig, WrOpcode};
use sim::*;

#[test]
#[ignore]
fn core_cost_per_datagram() {
    type C = Conn;
    let mk = |l: u32, r: u32| {
        let mut cfg = sim::config(l, r, 1);
        cfg.mtu = 4096;
        // As the driver makes them: 16 paths, runs of 16 packets on a path.
        cfg.num_paths = 16;
        cfg.path_burst = 16;
        let mut c = zeroed_conn();
        c.reset(cfg).unwrap();
        c
    };
    let mut ep: [Box<C>; 2] = [mk(1, 2), mk(2, 1)];
    let sa = ep[0].open_stream(StreamConfig::new(1, 2)).unwrap();
    ep[1].open_stream(StreamConfig::new(2, 1)).unwrap();
    let mut mem = [SimMemory::default(), SimMemory::default()];
    mem[0].add(1, 0x100000, 1 << 20);
    mem[1].add(2, 0x200000, 1 << 20);
    let total = 50_000u64;
    let (mut posted, mut done, mut datagrams) = (0u64, 0u64, 0u64);
    let mut now = 0u64;
    let mut bufs: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut buf = vec![0u8; 4200];
    let t = std::time::Instant::now();
    while done < total {
        while posted < total {
            let off = (posted % 200) * 4096;
            let w = SendWqe::new(posted, WrOpcode::RdmaWrite, sge(1, 0x100000 + off, 4096))
                .remote(0x200000 + off, 2);
            if ep[0].post_send(now, sa, w).is_err() {
                break;
            }
            posted += 1;
        }
        for i in 0..2 {
            while let Some(t) = ep[i].poll_transmit(now, &mut buf, &mut mem[i]) {
                bufs.push((1 - i, buf[..t.len].to_vec()));
            }
            while let Some(e) = ep[i].poll_event() {
                if let Event::SendCompletion(_) = e {
                    done += 1;
                }
            }
        }
        now += 1_000;
        for (to, b) in bufs.drain(..) {
            datagrams += 1;
            let _ = ep[to].handle_packet(now, &b, Arrival::default(), &mut mem[to]);
        }
        for c in ep.iter_mut() {
            if c.poll_timeout().is_some_and(|d| d <= now) {
                c.handle_timeout(now);
            }
        }
    }
    let el = t.elapsed();
    eprintln!(
        "{datagrams} datagrams ({total} x 4 KiB WRITEs) in {el:?}: {} ns per datagram (send + receive, incl. 4 KiB copies)",
        el.as_nanos() as u64 / datagrams
    );
}

/// The same for small messages one at a time (`ib_write_lat`'s pattern): 2-byte WRITEs each
/// way in turn, each sent when the other side's landed; the cost of one round trip.
#[test]
#[ignore]
fn core_cost_per_small_message_round_trip() {
    let mk = |l: u32, r: u32| {
        let mut cfg = sim::config(l, r, 1);
        cfg.num_paths = 16;
        cfg.path_burst = 16;
        let mut c = zeroed_conn();
        c.reset(cfg).unwrap();
        c
    };
    let mut ep: [Box<Conn>; 2] = [mk(1, 2), mk(2, 1)];
    let s = [
        ep[0].open_stream(StreamConfig::new(1, 2)).unwrap(),
        ep[1].open_stream(StreamConfig::new(2, 1)).unwrap(),
    ];
    let mut mem = [SimMemory::default(), SimMemory::default()];
    mem[0].add(1, 0x100000, 1 << 16);
    mem[1].add(2, 0x200000, 1 << 16);
    let keys = [
        (1u32, 0x100000u64, 2u32, 0x200000u64),
        (2, 0x200000, 1, 0x100000),
    ];
    let rounds = 10_000u64;
    let mut buf = vec![0u8; 4200];
    let mut now = 0u64;
    let mut datagrams = 0u64;
    let t = std::time::Instant::now();
    for n in 0..rounds * 2 {
        let from = (n % 2) as usize;
        let (lkey, laddr, rkey, raddr) = keys[from];
        let w = SendWqe::new(n, WrOpcode::RdmaWrite, sge(lkey, laddr, 2)).remote(raddr, rkey);
        ep[from].post_send(now, s[from], w).unwrap();
        // Until the write landed and its completion came back.
        let mut done = false;
        while !done {
            let mut moved = false;
            for i in 0..2 {
                while let Some(t) = ep[i].poll_transmit(now, &mut buf, &mut mem[i]) {
                    let b = buf[..t.len].to_vec();
                    datagrams += 1;
                    moved = true;
                    let _ = ep[1 - i].handle_packet(now, &b, Arrival::default(), &mut mem[1 - i]);
                }
                while let Some(e) = ep[i].poll_event() {
                    if let Event::SendCompletion(_) = e {
                        done = true;
                    }
                }
            }
            now += 1_000;
            if !moved {
                for c in ep.iter_mut() {
                    if c.poll_timeout().is_some_and(|d| d <= now) {
                        c.handle_timeout(now);
                    }
                }
            }
        }
    }
    let el = t.elapsed();
    eprintln!(
        "{rounds} round trips of 2-byte WRITEs ({datagrams} datagrams) in {el:?}: {} ns per round trip",
        el.as_nanos() as u64 / rounds
    );
}
