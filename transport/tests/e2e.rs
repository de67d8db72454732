//! End-to-end tests over the simulated fabric.

mod sim;

use metaroce_transport::stream::{CqOpcode, CqStatus, RecvWqe, SendWqe, WrOpcode};
use sim::*;

const A_BUF: u64 = 0x100000;
const B_BUF: u64 = 0x200000;

fn recv(sim: &mut Sim, wr_id: u64, addr: u64, len: u32) {
    let s = sim.ep[1].stream;
    sim.ep[1]
        .conn
        .post_recv(
            s,
            RecvWqe {
                wr_id,
                local: sge(2, addr, len),
            },
        )
        .unwrap();
}

fn post(sim: &mut Sim, wqe: SendWqe) {
    let s = sim.ep[0].stream;
    let now = sim.now;
    sim.ep[0].conn.post_send(now, s, wqe).unwrap();
}

#[test]
fn write_and_send_byte_exact() {
    let mut sim = Sim::new(LinkConfig::clean(), 1);
    let data = pattern(1, 10_000);
    sim.ep[0].mem.fill(1, A_BUF, &data);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 10_000)).remote(B_BUF + 100, 2),
    );
    recv(&mut sim, 7, B_BUF + 20_000, 4096);
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::Send, sge(1, A_BUF + 5, 3000)),
    );
    assert!(sim.run_until(10_000_000, |s| s.ep[0].send_cqes.len() == 2
        && s.ep[1].recv_cqes.len() == 1));
    assert_eq!(sim.ep[1].mem.bytes(2, B_BUF + 100, 10_000), &data[..]);
    assert_eq!(sim.ep[1].mem.bytes(2, B_BUF + 20_000, 3000), &data[5..3005]);
    let c = &sim.ep[0].send_cqes;
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, CqStatus::Success, CqOpcode::RdmaWrite)
    );
    assert_eq!((c[1].wr_id, c[1].status), (2, CqStatus::Success));
    let r = &sim.ep[1].recv_cqes[0];
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.opcode),
        (7, CqStatus::Success, 3000, CqOpcode::Recv)
    );
    assert_eq!(sim.retransmits(), 0);
}
