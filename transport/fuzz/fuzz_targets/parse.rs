// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Parses arbitrary bytes; whatever parses must re-emit to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_transport::wire::{AckWriter, Ext, Packet};

fuzz_target!(|data: &[u8]| {
    let Ok(view) = Packet::parse(data) else {
        return;
    };
    let mut out = vec![0u8; data.len() + 64];
    let n = match view.header.ext {
        Ext::Ack(info) => {
            let mut w = AckWriter::new(&mut out, view.header.base, info).expect("ack header fits");
            for p in view.ack_paths() {
                w.push_path(&p).expect("path entry fits");
            }
            for s in view.ack_streams() {
                w.push_stream(&s).expect("stream entry fits");
            }
            w.finish()
        }
        _ => {
            let h = view.header.emit(&mut out).expect("parsed header re-emits");
            out[h..h + view.payload.len()].copy_from_slice(view.payload);
            h + view.payload.len()
        }
    };
    assert_eq!(&out[..n], data, "round trip");
});
