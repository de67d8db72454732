// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! `zero_valid!`: a [`ZeroValid`](super::ZeroValid) implementation the compiler checks.
//!
//! A file of its own so that the documentation tests of `ZeroValid` can include it (they
//! build outside the crate, which does not export macros). Its expansion names the trait as
//! `ZeroValid`: import it where the macro is used.

/// Implements `ZeroValid` for a struct or a fieldless enum, with the compile-time check that
/// backs it (see `ZeroValid`):
///
/// - `zero_valid!(struct Name { a, b, c })`: a struct, every field listed. The check
///   destructures a `&Name` without `..` (a field added or left out breaks the build, with
///   "pattern requires `..` due to inaccessible fields") and requires each field's type to be
///   `ZeroValid`.
/// - `zero_valid!(struct Name<P: Bound, ..> { a, b, c })`: the same for a generic struct (one
///   bound per parameter, as in its definition), implemented where each parameter is also
///   `ZeroValid`.
/// - `zero_valid!(Name::Variant)`: a fieldless `#[repr(u8)]` enum whose variant 0 is
///   `Variant`, asserted at compile time (a byte, and `Variant as u8 == 0`).
macro_rules! zero_valid {
    (struct $name:ident $(<$($param:ident: $bound:path),+ $(,)?>)? { $($field:ident),* $(,)? }) => {
        impl$(<$($param: $bound + ZeroValid),+>)? ZeroValid for $name$(<$($param),+>)? {}
        const _: () = {
            #[allow(dead_code)]
            fn check$(<$($param: $bound + ZeroValid),+>)?(value: &$name$(<$($param),+>)?) {
                fn field<T: ZeroValid + ?Sized>(_: &T) {}
                let $name { $($field),* } = value;
                $(field($field);)*
            }
        };
    };
    ($name:ident :: $variant:ident) => {
        impl ZeroValid for $name {}
        const _: () = assert!(
            core::mem::size_of::<$name>() == 1 && $name::$variant as u8 == 0,
            "all-zero bytes must be this variant",
        );
    };
}

pub(crate) use zero_valid;
