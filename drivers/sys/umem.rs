// SPDX-License-Identifier: GPL-2.0

//! User memory pinned for a memory region (`ib_umem`), and byte copies in and out of it.
//!
//! The pages are looked up once at registration; a copy maps one page at a time with
//! `kmap_local_page`, so it works in any context (process, softirq, timer).

use super::bindings;
use core::ptr::NonNull;
use kernel::{alloc::KVVec, prelude::*};

use kernel::page::PAGE_SIZE;

/// A `struct page *` of pinned user memory.
#[derive(Clone, Copy)]
struct PagePtr(NonNull<bindings::page>);

// SAFETY: a pinned page is a kernel object that any CPU may map; the pointer is only a name.
unsafe impl Send for PagePtr {}
// SAFETY: as above; shared access only maps the page.
unsafe impl Sync for PagePtr {}

/// `length` bytes of user memory starting at user address `address`, pinned.
pub(crate) struct UserMemory {
    umem: NonNull<bindings::ib_umem>,
    pages: KVVec<PagePtr>,
    /// Offset of `address` in its first page.
    first_offset: usize,
    length: u64,
}

// SAFETY: the umem is only released in `drop`; the pages are pinned for the object's lifetime
// and accessed through per-call mappings.
unsafe impl Send for UserMemory {}
// SAFETY: as above; concurrent copies touch user memory, which has no Rust aliasing rules.
unsafe impl Sync for UserMemory {}

impl UserMemory {
    /// Pins `[address, address + length)` of the calling process for `ibdev`.
    ///
    /// # Safety
    ///
    /// `ibdev` must be a live device; call from the process that owns the memory.
    pub(super) unsafe fn pin(
        ibdev: *mut bindings::ib_device,
        address: u64,
        length: u64,
        access: i32,
    ) -> Result<Self> {
        let len = usize::try_from(length).map_err(|_| EINVAL)?;
        // SAFETY: `ibdev` is live; a null attribute bundle means "use the address".
        let umem = unsafe {
            bindings::ib_umem_get_attr_or_va(ibdev, core::ptr::null(), 0, address, len, access)
        };
        // The result is an ERR_PTR on failure.
        let raw = umem as isize;
        if (-4095..0).contains(&raw) {
            return Err(Error::from_errno(raw as i32));
        }
        let umem = NonNull::new(umem).ok_or(ENOMEM)?;
        let mut mem = UserMemory {
            umem,
            pages: KVVec::new(),
            first_offset: (address as usize) & (PAGE_SIZE - 1),
            length,
        };
        let npages = (mem.first_offset + len).div_ceil(PAGE_SIZE);
        mem.pages.reserve(npages, GFP_KERNEL)?;
        // SAFETY: the umem is ours until drop; its sg table lists the pinned pages in order.
        unsafe {
            let sgt = &mut (*umem.as_ptr()).sgt_append.sgt;
            let mut iter = bindings::sg_page_iter::default();
            bindings::__sg_page_iter_start(&mut iter, sgt.sgl, sgt.orig_nents, 0);
            while bindings::__sg_page_iter_next(&mut iter) {
                let page = NonNull::new(bindings::metaroce_glue_sg_page_iter_page(&mut iter))
                    .ok_or(EFAULT)?;
                mem.pages.push(PagePtr(page), GFP_KERNEL)?;
            }
        }
        if mem.pages.len() < npages {
            return Err(EFAULT);
        }
        Ok(mem)
    }

    /// Bytes covered.
    pub(crate) fn len(&self) -> u64 {
        self.length
    }

    /// Whether the pages were pinned for writing (`ib_umem.writable`: the access flags
    /// allowed a write).
    pub(crate) fn writable(&self) -> bool {
        // SAFETY: the umem is ours until drop; `writable` is set once by `ib_umem_get`.
        unsafe { (*self.umem.as_ptr()).writable() != 0 }
    }

    /// Calls `f(page_bytes)` for each page piece of `[offset, offset + len)`, each mapped for
    /// the duration of the call. The caller has checked the range against `len()`; a range
    /// beyond it is refused here anyway.
    fn for_each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result {
        let end = offset.checked_add(len as u64).ok_or(EINVAL)?;
        if end > self.length {
            return Err(EINVAL);
        }
        let mut pos = self.first_offset + offset as usize;
        let mut done = 0;
        while done < len {
            let page = self.pages.get(pos / PAGE_SIZE).ok_or(EINVAL)?;
            let in_page = pos % PAGE_SIZE;
            let n = (PAGE_SIZE - in_page).min(len - done);
            // SAFETY: the page is pinned for our lifetime; the mapping lives until kunmap.
            unsafe {
                let base = bindings::metaroce_glue_kmap_local_page(page.0.as_ptr()).cast::<u8>();
                f(base.add(in_page), done, n);
                bindings::metaroce_glue_kunmap_local(base.cast());
            }
            pos += n;
            done += n;
        }
        Ok(())
    }

    /// Copies `data` to `offset`.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result {
        self.for_each_piece(offset, data.len(), |dst, from, n| {
            // SAFETY: `dst` is `n` mapped bytes of the page; `data[from..from + n]` is in
            // bounds by construction. User memory may change under us; bytes are bytes.
            unsafe { core::ptr::copy_nonoverlapping(data.as_ptr().add(from), dst, n) }
        })
    }

    /// Copies from `offset` into `out`.
    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) -> Result {
        let out_ptr = out.as_mut_ptr();
        self.for_each_piece(offset, out.len(), |src, to, n| {
            // SAFETY: as in `write`, the other way round.
            unsafe { core::ptr::copy_nonoverlapping(src, out_ptr.add(to), n) }
        })
    }

    /// Applies `op` to the aligned 8-byte word at `offset` and returns its old value, as one
    /// atomic read-modify-write (a compare-and-exchange loop): atomic against every other
    /// atomic through this device, whatever connection it comes on, and against CPU atomics on
    /// the same word.
    pub(crate) fn atomic(&self, offset: u64, op: impl Fn(u64) -> u64) -> Result<u64> {
        if offset % 8 != 0 || (self.first_offset as u64 + offset) % 8 != 0 {
            return Err(EINVAL);
        }
        let mut old = 0u64;
        self.for_each_piece(offset, 8, |p, _, n| {
            if n == 8 {
                // SAFETY: 8 aligned, mapped bytes of pinned memory (an aligned word never
                // crosses a page), live while the umem is; every access to it from the kernel
                // is atomic, and userspace's plain accesses race as they do with a NIC's.
                let word = unsafe { core::sync::atomic::AtomicU64::from_ptr(p.cast::<u64>()) };
                let mut cur = word.load(core::sync::atomic::Ordering::SeqCst);
                loop {
                    match word.compare_exchange(
                        cur,
                        op(cur),
                        core::sync::atomic::Ordering::SeqCst,
                        core::sync::atomic::Ordering::SeqCst,
                    ) {
                        Ok(_) => break,
                        Err(now) => cur = now,
                    }
                }
                old = cur;
            }
        })?;
        Ok(old)
    }
}

impl Drop for UserMemory {
    fn drop(&mut self) {
        // SAFETY: we own the umem from `pin`; releasing unpins the pages.
        unsafe { bindings::ib_umem_release(self.umem.as_ptr()) }
    }
}
