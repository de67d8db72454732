// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! How much of its lossless goodput a stream keeps under random loss when the round trip is
//! long against its message window (`stream::MSG_WINDOW` messages beyond the responder's
//! completion point): a lost packet holds its message's completion, and with it the window,
//! for the two or three round trips its recovery takes. A measurement, not a check (the
//! figures are in `docs/datapath.md`, "Loss in the guest"); to compare windows, change
//! `MSG_WINDOW` and `SQ_DEPTH` (and `RQ_DEPTH`, twice the window) and run it again:
//! `cargo test --release -p metaroce-transport --test message_window -- --ignored --nocapture`

mod sim;

use metaroce_transport::stream::{WrOpcode, MSG_WINDOW};
use sim::*;

#[test]
#[ignore]
fn goodput_kept_under_loss_against_the_round_trip() {
    // 16 KiB WRITEs (16 packets of 1 KiB) on 8 paths at 500 Mbit/s, runs of 16 packets per
    // path and the driver's timers: 16 messages are 256 packets, 4.2 ms at this rate, so at
    // a 2 ms round trip the window is twice the bandwidth-delay product, as 16 messages of
    // 64 KiB are in the guest (1,000 packets against round trips of 3-15 ms under load).
    let msgs: Vec<Msg> = (0..250)
        .map(|_| Msg {
            op: WrOpcode::RdmaWrite,
            len: 16 << 10,
        })
        .collect();
    eprintln!("message window {MSG_WINDOW}: goodput Mbit/s (share of lossless)");
    for rtt_us in [200u64, 2_000, 8_000] {
        let mut row = format!("round trip {rtt_us:>5} us:");
        let mut lossless = 0;
        for loss in [0u32, 100, 1_000] {
            let mut link = LinkConfig::clean().loss(loss);
            link.path_delay_ns = (0..PATHS as u64)
                .map(|i| rtt_us * 500 + 10_000 * i)
                .collect();
            link.rate_bits_per_us = 500;
            let mut sim = Sim::with_config(link, 1, |c| {
                c.path_burst = 16;
                c.path.min_rto = 5_000_000;
                c.path.initial_rto = 10_000_000;
                c.path.max_rto = 100_000_000;
                c.stall_timeout = 250_000_000;
            });
            let r = run_workload(&mut sim, &msgs, 60_000_000_000);
            assert!(r.completed, "{r:?}");
            let g = r.goodput_mbps();
            if loss == 0 {
                lossless = g.max(1);
            }
            row += &format!(
                "  {}% loss {g} ({}%)",
                f64::from(loss) / 100.0,
                g * 100 / lossless
            );
        }
        eprintln!("{row}");
    }
}
