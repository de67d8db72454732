// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Bounds-checked big-endian (network order) reader and writer over byte slices.
//!
//! Every access goes through `get`/`get_mut`, so a short buffer is an error, never a panic.

use super::{EmitError, ParseError};

/// Reads network-order integers from a byte slice, front to back.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        let end = self.pos.checked_add(n).ok_or(ParseError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(ParseError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], ParseError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ParseError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ParseError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ParseError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Reads a field that version 1 reserves: it must be zero.
    pub(crate) fn reserved(&mut self, n: usize) -> Result<(), ParseError> {
        if self.take(n)?.iter().all(|b| *b == 0) {
            Ok(())
        } else {
            Err(ParseError::ReservedNonZero)
        }
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }
}

/// Writes network-order integers into a byte slice, front to back.
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> Result<(), EmitError> {
        let end = self
            .pos
            .checked_add(b.len())
            .ok_or(EmitError::BufferTooSmall)?;
        let dst = self
            .buf
            .get_mut(self.pos..end)
            .ok_or(EmitError::BufferTooSmall)?;
        dst.copy_from_slice(b);
        self.pos = end;
        Ok(())
    }

    pub(crate) fn u8(&mut self, v: u8) -> Result<(), EmitError> {
        self.bytes(&[v])
    }

    pub(crate) fn u16(&mut self, v: u16) -> Result<(), EmitError> {
        self.bytes(&v.to_be_bytes())
    }

    pub(crate) fn u32(&mut self, v: u32) -> Result<(), EmitError> {
        self.bytes(&v.to_be_bytes())
    }

    pub(crate) fn u64(&mut self, v: u64) -> Result<(), EmitError> {
        self.bytes(&v.to_be_bytes())
    }

    pub(crate) fn zeros(&mut self, n: usize) -> Result<(), EmitError> {
        for _ in 0..n {
            self.u8(0)?;
        }
        Ok(())
    }
}
