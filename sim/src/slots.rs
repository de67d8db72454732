// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Stream storage that grows as streams open, in chunks, the way the kernel's does (and
//! `transport/tests/sim`'s `SimSlots`): a connection with many QPs holds only the chunks it
//! needs, and a zeroed connection holding it (no chunks) is valid.

use metaroce_transport::connection::StreamSlots;
use metaroce_transport::stream::Stream;
use metaroce_transport::zero::ZeroValid;

/// Streams per chunk.
pub const CHUNK: usize = 16;
/// Most chunks (1,024 streams).
pub const MAX_CHUNKS: usize = 64;

pub struct Slots {
    chunks: [Option<Box<[Stream; CHUNK]>>; MAX_CHUNKS],
    count: usize,
}

// No chunks: an `Option<Box<_>>` is `None` when all-zero (the null pointer, which std
// guarantees). Every field is named, as `zero_valid!` does in the transport; the box's type
// is pinned, since an `Option` is not `ZeroValid`.
impl ZeroValid for Slots {}
const _: () = {
    #[allow(dead_code)]
    fn check(slots: &Slots) {
        fn field<T: ZeroValid + ?Sized>(_: &T) {}
        let Slots { chunks, count } = slots;
        let _: &[Option<Box<[Stream; CHUNK]>>; MAX_CHUNKS] = chunks;
        field(count);
    }
};

impl Slots {
    /// Bytes of the chunks allocated.
    pub fn bytes(&self) -> usize {
        self.count * std::mem::size_of::<[Stream; CHUNK]>()
    }
}

impl StreamSlots for Slots {
    fn slot_count(&self) -> usize {
        self.count * CHUNK
    }
    fn slot(&self, i: usize) -> Option<&Stream> {
        self.chunks.get(i / CHUNK)?.as_ref()?.get(i % CHUNK)
    }
    fn slot_mut(&mut self, i: usize) -> Option<&mut Stream> {
        self.chunks.get_mut(i / CHUNK)?.as_mut()?.get_mut(i % CHUNK)
    }
    fn grow(&mut self) -> bool {
        let Some(c) = self.chunks.get_mut(self.count) else {
            return false;
        };
        // All-zero: closed streams (see `Connection::reset`).
        *c = Some(crate::meta::zeroed_box::<[Stream; CHUNK]>());
        self.count += 1;
        true
    }
    fn release(&mut self) {
        for c in self.chunks.iter_mut() {
            *c = None;
        }
        self.count = 0;
    }
}
