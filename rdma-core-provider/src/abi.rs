// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The provider's side of the kernel ABI (`uapi/metaroce-abi.h`), in safe Rust.
//!
//! The constants come from the bindgen'd header, so they cannot drift from the kernel module's;
//! this module turns the raw responses into checked values.

use crate::ffi::sys;
use core::ffi::{c_char, c_int};
use core::fmt;

/// `ib_device_ops.driver_id` of the metaroce kernel module (netlink reports it per device).
pub const DRIVER_ID: u32 = sys::METAROCE_DRIVER_ID;
/// The one uverbs ABI version (`ib_device_ops.uverbs_abi_ver`) this provider speaks.
pub const UVERBS_ABI_VERSION: u32 = sys::METAROCE_UVERBS_ABI_VERSION;
/// Provider name: `driver metaroce` in metaroce.driver, libibverbs then loads
/// `libibverbs/libmetaroce-rdmav34.so` (a symlink to `libmetaroce.so.1`).
pub const PROVIDER_NAME: &core::ffi::CStr = c"metaroce";
/// The libibverbs private ABI this provider is built for (the plugin name carries it).
pub const PRIVATE_ABI: u32 = sys::IBVERBS_PABI_VERSION;

/// What the kernel tells a new user context (`struct metaroce_alloc_ucontext_resp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// MetaRoCE wire format version spoken by the device.
    pub wire_version: u32,
    /// Logical paths per connection the device supports.
    pub max_paths: u32,
    /// Netdevs (planes) one device may span.
    pub max_planes: u32,
}

/// The kernel answered alloc_ucontext with an ABI we do not speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbiMismatch {
    /// The `abi_version` the kernel reported.
    pub kernel: u32,
}

impl fmt::Display for AbiMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "metaroce: kernel ucontext ABI version {} but this provider speaks {}",
            self.kernel, UVERBS_ABI_VERSION
        )
    }
}

impl DeviceInfo {
    /// Check and decode the driver-specific part of the alloc_ucontext response.
    pub fn from_ucontext_resp(
        resp: &sys::metaroce_alloc_ucontext_resp,
    ) -> Result<Self, AbiMismatch> {
        if resp.abi_version != UVERBS_ABI_VERSION {
            return Err(AbiMismatch {
                kernel: resp.abi_version,
            });
        }
        Ok(Self {
            wire_version: resp.wire_version,
            max_paths: resp.max_paths,
            max_planes: resp.max_planes,
        })
    }
}

/// errno for an alloc_context refused because of an ABI mismatch.
pub const ABI_MISMATCH_ERRNO: c_int = sys::EPROTO as c_int;

/// `ibv_device_attr.fw_ver` text for the kernel's raw `fw_ver`, which packs
/// `major << 32 | minor << 16 | sub_minor` (16 bits each, as rxe does): "major.minor.sub_minor",
/// NUL-terminated.
pub fn fw_ver_string<const N: usize>(raw: u64) -> [c_char; N] {
    let parts = [(raw >> 32) & 0xffff, (raw >> 16) & 0xffff, raw & 0xffff];
    let mut text = [0u8; 24]; // "65535.65535.65535" fits
    let mut len = 0;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        let mut digits = [0u8; 5];
        let mut n = *part;
        let mut count = 0;
        loop {
            digits[count] = b'0' + (n % 10) as u8;
            count += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for d in digits[..count].iter().rev() {
            text[len] = *d;
            len += 1;
        }
    }
    let mut out = [0 as c_char; N];
    // Keep the terminating NUL even if N is tiny.
    for (o, t) in out.iter_mut().zip(&text[..len.min(N.saturating_sub(1))]) {
        *o = *t as c_char;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(abi_version: u32) -> sys::metaroce_alloc_ucontext_resp {
        sys::metaroce_alloc_ucontext_resp {
            abi_version,
            wire_version: 3,
            max_paths: 8,
            max_planes: 2,
            reserved: [0; 2],
        }
    }

    #[test]
    fn abi_constants_match_the_shared_header() {
        // Values of uapi/metaroce-abi.h as agreed with the kernel module; a change there must be
        // deliberate (it breaks the other side).
        assert_eq!(DRIVER_ID, 0x4d52);
        assert_eq!(UVERBS_ABI_VERSION, 1);
        assert_eq!(sys::METAROCE_UDP_PORT, 4793);
        assert_eq!(PRIVATE_ABI, 34);
        assert_eq!(PROVIDER_NAME.to_bytes(), b"metaroce");
        // The ioctl header carries the driver id in 16 bits.
        assert!(u16::try_from(DRIVER_ID).is_ok());
    }

    #[test]
    fn ucontext_resp_layout() {
        use core::mem::{offset_of, size_of};
        type R = sys::metaroce_alloc_ucontext_resp;
        assert_eq!(size_of::<R>(), 32);
        assert_eq!(offset_of!(R, abi_version), 0);
        assert_eq!(offset_of!(R, wire_version), 4);
        assert_eq!(offset_of!(R, max_paths), 8);
        assert_eq!(offset_of!(R, max_planes), 12);
        assert_eq!(offset_of!(R, reserved), 16);
        // The driver payload follows the 8-byte core response directly, no padding.
        type G = sys::metaroce_get_context_resp;
        assert_eq!(offset_of!(G, drv_payload), 8);
        assert_eq!(size_of::<G>(), 40);
    }

    #[test]
    fn accepts_our_abi_version() {
        let info = DeviceInfo::from_ucontext_resp(&resp(1)).unwrap();
        assert_eq!(
            info,
            DeviceInfo {
                wire_version: 3,
                max_paths: 8,
                max_planes: 2
            }
        );
    }

    #[test]
    fn rejects_other_abi_versions() {
        for v in [0, 2, u32::MAX] {
            assert_eq!(
                DeviceInfo::from_ucontext_resp(&resp(v)),
                Err(AbiMismatch { kernel: v })
            );
        }
        let msg = AbiMismatch { kernel: 2 }.to_string();
        assert!(
            msg.contains("version 2") && msg.contains("speaks 1"),
            "{msg}"
        );
    }

    fn text<const N: usize>(s: &[c_char; N]) -> String {
        s.iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8 as char)
            .collect()
    }

    #[test]
    fn fw_ver_formatting() {
        assert_eq!(text(&fw_ver_string::<64>(0)), "0.0.0");
        assert_eq!(text(&fw_ver_string::<64>(1 << 32 | 2 << 16 | 3)), "1.2.3");
        assert_eq!(text(&fw_ver_string::<64>(u64::MAX)), "65535.65535.65535");
        // Truncated but terminated.
        let short = fw_ver_string::<4>(1 << 32 | 2 << 16 | 3);
        assert_eq!(text(&short), "1.2");
        assert_eq!(short[3], 0);
        assert_eq!(fw_ver_string::<0>(5), []);
    }
}
