// SPDX-License-Identifier: GPL-2.0
//! The multicast table (`verbs_core::mcast`) against a model: random sequences of attaches,
//! detaches and QP destructions, as any number of users may make them, over a small table.
//! After every step the table says what the model says: the result of the call, the members
//! of every group in order, and (for a destroyed QP) which groups it emptied. The table never
//! holds more groups than its slots nor more QPs per group than `MAX_ATTACH`.

use proptest::prelude::*;
use std::collections::BTreeMap;
use verbs_core::mcast::{self, Attached, Detached, Group, McastError, MAX_ATTACH};

const SLOTS: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    Attach(usize, u32),
    Detach(usize, u32),
    Destroy(u32),
}

/// Six GIDs: four groups (IPv4 and IPv6), two unicast addresses.
fn gid(i: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    match i {
        0 | 1 => {
            g[10] = 0xff;
            g[11] = 0xff;
            g[12] = 230;
            g[15] = i as u8;
        }
        2 | 3 => {
            g[0] = 0xff;
            g[1] = 0x0e;
            g[15] = i as u8;
        }
        4 => {
            g[10] = 0xff;
            g[11] = 0xff;
            g[12] = 10;
            g[15] = 1;
        }
        _ => {
            g[0] = 0xfe;
            g[1] = 0x80;
            g[15] = 1;
        }
    }
    g
}

fn op() -> impl Strategy<Value = Op> {
    // QPNs from a range wider than MAX_ATTACH, so that groups fill up.
    let qpn = 1u32..(MAX_ATTACH as u32 + 8);
    prop_oneof![
        6 => (0usize..6, qpn.clone()).prop_map(|(g, q)| Op::Attach(g, q)),
        3 => (0usize..6, qpn.clone()).prop_map(|(g, q)| Op::Detach(g, q)),
        1 => qpn.prop_map(Op::Destroy),
    ]
}

proptest! {
    #[test]
    fn table_follows_the_model(ops in prop::collection::vec(op(), 1..400)) {
        let mut table = vec![Group::EMPTY; SLOTS];
        // Groups by GID index, their members in the order they came.
        let mut model: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Attach(g, q) => {
                    let got = mcast::attach(&mut table, &gid(g), q);
                    let want = if g >= 4 {
                        Err(McastError::Invalid)
                    } else if let Some(m) = model.get_mut(&g) {
                        if m.contains(&q) {
                            Ok(Attached::Already)
                        } else if m.len() == MAX_ATTACH {
                            Err(McastError::Full)
                        } else {
                            m.push(q);
                            Ok(Attached::Joined)
                        }
                    } else if model.len() == SLOTS {
                        Err(McastError::Full)
                    } else {
                        model.insert(g, vec![q]);
                        Ok(Attached::First)
                    };
                    prop_assert_eq!(got, want);
                }
                Op::Detach(g, q) => {
                    let got = mcast::detach(&mut table, &gid(g), q);
                    let want = match model.get_mut(&g) {
                        Some(m) if m.contains(&q) => {
                            m.retain(|&x| x != q);
                            if m.is_empty() {
                                model.remove(&g);
                                Ok(Detached::Last)
                            } else {
                                Ok(Detached::Left)
                            }
                        }
                        _ => Err(McastError::Invalid),
                    };
                    prop_assert_eq!(got, want);
                }
                Op::Destroy(q) => {
                    let mut emptied = Vec::new();
                    mcast::detach_everywhere(&mut table, q, |g| emptied.push(*g));
                    let mut want = Vec::new();
                    for (g, m) in model.iter_mut() {
                        m.retain(|&x| x != q);
                        if m.is_empty() {
                            want.push(gid(*g));
                        }
                    }
                    model.retain(|_, m| !m.is_empty());
                    emptied.sort();
                    want.sort();
                    prop_assert_eq!(emptied, want);
                }
            }
            for g in 0..6 {
                let want: &[u32] = model.get(&g).map_or(&[], |m| m.as_slice());
                prop_assert_eq!(mcast::members(&table, &gid(g)), want);
            }
        }
    }
}
