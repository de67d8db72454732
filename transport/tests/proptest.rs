//! Property tests over the simulated fabric: whatever the loss (below 100%), reordering and
//! duplication, every message is delivered exactly once, byte-exact, with completions in
//! posting order.

mod sim;

use metaroce_transport::stream::WrOpcode;
use proptest::prelude::*;
use sim::*;

fn arb_msg() -> impl Strategy<Value = Msg> {
    (
        prop::sample::select(vec![
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
            WrOpcode::FetchAdd,
            WrOpcode::CmpSwap,
        ]),
        prop_oneof![0u32..64, 0u32..5000, Just(16384u32)],
    )
        .prop_map(|(op, len)| Msg { op, len })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn exactly_once_in_order(
        seed in any::<u64>(),
        loss_pct_x100 in 0u32..4000,
        reorder_pct in 0u32..60,
        reorder_max_us in 0u64..80,
        dup_pct_x100 in 0u32..1000,
        msgs in prop::collection::vec(arb_msg(), 1..48),
    ) {
        let link = LinkConfig::clean()
            .loss(loss_pct_x100)
            .reorder(reorder_pct, reorder_max_us * 1000)
            .dup(dup_pct_x100);
        let mut sim = Sim::new(link, seed);
        // Under extreme loss a finite retry count can legitimately run out: use a large one.
        sim.set_retry_cnt(255);
        let r = run_workload(&mut sim, &msgs, 60_000_000_000);
        prop_assert!(r.completed, "not completed: {:?}", r);
    }

    #[test]
    fn reordering_alone_never_retransmits(
        seed in any::<u64>(),
        reorder_pct in 0u32..60,
        reorder_max_us in 0u64..60,
        msgs in prop::collection::vec(arb_msg(), 1..32),
    ) {
        let mut sim = Sim::new(LinkConfig::clean().reorder(reorder_pct, reorder_max_us * 1000), seed);
        let r = run_workload(&mut sim, &msgs, 10_000_000_000);
        prop_assert!(r.completed);
        prop_assert_eq!(r.retransmits, 0);
    }
}
