// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Types whose all-zero bytes are a valid value: what a zero-allocated connection is made of.
//!
//! A [`Connection`](super::connection::Connection) is too large for the stack, so a caller
//! allocates it zeroed and calls `reset` (transport/README.md); the kernel module asserts
//! that with `unsafe impl pin_init::Zeroable`, `tests/sim` with `Box::new_zeroed`. Such a
//! caller requires [`ZeroValid`] of the type, and the compiler checks every implementation
//! of it down to the primitives: the struct implementations name each field and require its
//! type to be `ZeroValid` too (the crate's `zero_valid!` macro, next to each struct), so a
//! field added to a stored struct does not build until it is listed, and an `Option<u32>`,
//! `char`, reference or `NonZero*` field does not build at all.

mod macros;

pub(crate) use macros::zero_valid;

/// All-zero bytes are a valid value of this type, and a value its owner's `reset` can start
/// from (it reads nothing of it that it has not written first, and drops nothing).
///
/// The trait is safe to implement, but `unsafe` code relies on it (the kernel module's
/// `Zeroable` implementations, `tests/sim`'s zeroed boxes), so it is implemented only where
/// the compiler checks the claim:
///
/// - the primitive integers and `bool` (here), arrays and `Cell`s of `ZeroValid` types;
/// - a struct with `zero_valid!(struct Name { field, .. })` next to its definition, listing
///   every field (no `..`); each field's type must be `ZeroValid` (a generic one's parameters
///   too: `zero_valid!(struct Name<P: Bound> { .. })` implements it where `P: ZeroValid`);
/// - a fieldless `#[repr(u8)]` enum with `zero_valid!(Name::Variant)`, which asserts at
///   compile time that `Variant` is 0 (make it the value `reset` gives);
/// - a `#[repr(u8)]` enum with data by hand, its all-zero variant written `Variant = 0` (the
///   compiler refuses a second variant 0) and carrying nothing (or only fields checked as in
///   a struct), with a comment saying so.
///
/// Never `ZeroValid` in the transport: `Option` of anything (which bytes make `None` is
/// unspecified, but for pointer-like payloads), `char`, references, `NonZero*`, function
/// pointers, enums without a primitive `repr`.
///
/// A struct is checked through its fields:
///
/// ```
/// # #[path = "zero/macros.rs"]
/// # mod macros;
/// # use macros::zero_valid;
/// use metaroce_transport::zero::ZeroValid;
///
/// struct Window {
///     cum: u32,
///     bits: [u64; 4],
///     open: bool,
/// }
/// zero_valid!(struct Window { cum, bits, open });
///
/// fn zeroed<T: ZeroValid>() {}
/// zeroed::<[Window; 8]>();
/// ```
///
/// and does not build with a field whose type is not `ZeroValid` (an `Option<u32>` field is
/// `None` or `Some` by a discriminant whose zero value is unspecified):
///
/// ```compile_fail
/// # #[path = "zero/macros.rs"]
/// # mod macros;
/// # use macros::zero_valid;
/// use metaroce_transport::zero::ZeroValid;
///
/// struct Window {
///     cum: u32,
///     bits: [u64; 4],
///     open: bool,
///     last: Option<u32>,
/// }
/// zero_valid!(struct Window { cum, bits, open, last });
/// ```
///
/// nor with a field left out of the list:
///
/// ```compile_fail
/// # #[path = "zero/macros.rs"]
/// # mod macros;
/// # use macros::zero_valid;
/// use metaroce_transport::zero::ZeroValid;
///
/// struct Window {
///     cum: u32,
///     bits: [u64; 4],
///     open: bool,
///     last: u32,
/// }
/// zero_valid!(struct Window { cum, bits, open });
/// ```
///
/// A fieldless enum is checked through its variant 0:
///
/// ```
/// # #[path = "zero/macros.rs"]
/// # mod macros;
/// # use macros::zero_valid;
/// use metaroce_transport::zero::ZeroValid;
///
/// #[repr(u8)]
/// enum State {
///     Idle,
///     Busy,
/// }
/// zero_valid!(State::Idle);
/// ```
///
/// and does not build if that variant is not 0:
///
/// ```compile_fail
/// # #[path = "zero/macros.rs"]
/// # mod macros;
/// # use macros::zero_valid;
/// use metaroce_transport::zero::ZeroValid;
///
/// #[repr(u8)]
/// enum State {
///     Busy = 1,
///     Idle = 2,
/// }
/// zero_valid!(State::Idle);
/// ```
pub trait ZeroValid {}

impl ZeroValid for bool {}
impl ZeroValid for u8 {}
impl ZeroValid for u16 {}
impl ZeroValid for u32 {}
impl ZeroValid for u64 {}
impl ZeroValid for u128 {}
impl ZeroValid for usize {}
impl ZeroValid for i8 {}
impl ZeroValid for i16 {}
impl ZeroValid for i32 {}
impl ZeroValid for i64 {}
impl ZeroValid for i128 {}
impl ZeroValid for isize {}

/// Every element all-zero.
impl<T: ZeroValid, const N: usize> ZeroValid for [T; N] {}

/// A `Cell` has the in-memory representation of its contents.
impl<T: ZeroValid + ?Sized> ZeroValid for core::cell::Cell<T> {}
