// SPDX-License-Identifier: GPL-2.0

//! The driver data of the direct verbs' `modify_qp` (`struct metaroce_modify_qp_cmd`), judged
//! from the bytes the caller gave.

/// `METAROCE_MODIFY_QP_PLANES`: the command sets `plane_mask`.
pub const MODIFY_QP_PLANES: u32 = 1;
/// `sizeof(struct metaroce_modify_qp_cmd)`: comp_mask, plane_mask, reserved (u64).
pub const MODIFY_QP_CMD_SIZE: usize = 16;

/// What a `modify_qp`'s driver data asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DvModify {
    /// Restrict the QP to these planes (bit k: plane k).
    pub planes: Option<u32>,
}

/// Why driver data is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdataError {
    /// A field this kernel does not know is set (a newer provider's request): `EOPNOTSUPP`.
    Unsupported,
    /// A reserved field is not zero: `EINVAL`.
    Invalid,
}

/// Judges a `modify_qp`'s driver data: `head` is the first `min(inlen, MODIFY_QP_CMD_SIZE)`
/// bytes the caller gave (a shorter command reads as zero beyond its end), `tail_cleared`
/// whether every byte past the struct is zero (a longer command from a newer provider may
/// only ask what this kernel knows). No data at all is a stock `modify_qp`.
pub fn modify_qp_cmd(head: &[u8], tail_cleared: bool) -> Result<DvModify, UdataError> {
    if head.is_empty() {
        return Ok(DvModify::default());
    }
    if !tail_cleared {
        return Err(UdataError::Unsupported);
    }
    let mut cmd = [0u8; MODIFY_QP_CMD_SIZE];
    for (d, s) in cmd.iter_mut().zip(head) {
        *d = *s;
    }
    let word = |at: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&cmd[at..at + 4]);
        u32::from_ne_bytes(b)
    };
    let (comp_mask, plane_mask) = (word(0), word(4));
    if comp_mask & !MODIFY_QP_PLANES != 0 {
        return Err(UdataError::Unsupported);
    }
    if cmd[8..].iter().any(|b| *b != 0) {
        return Err(UdataError::Invalid);
    }
    Ok(DvModify {
        planes: (comp_mask & MODIFY_QP_PLANES != 0).then_some(plane_mask),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(comp: u32, planes: u32, reserved: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&comp.to_ne_bytes());
        b[4..8].copy_from_slice(&planes.to_ne_bytes());
        b[8..].copy_from_slice(&reserved.to_ne_bytes());
        b
    }

    #[test]
    fn judges_the_command() {
        assert_eq!(modify_qp_cmd(&[], true), Ok(DvModify::default()));
        assert_eq!(
            modify_qp_cmd(&cmd(1, 0b101, 0), true),
            Ok(DvModify { planes: Some(5) })
        );
        assert_eq!(
            modify_qp_cmd(&cmd(0, 0b101, 0), true),
            Ok(DvModify { planes: None })
        );
        assert_eq!(
            modify_qp_cmd(&cmd(2, 0, 0), true),
            Err(UdataError::Unsupported)
        );
        assert_eq!(modify_qp_cmd(&cmd(1, 0, 1), true), Err(UdataError::Invalid));
        assert_eq!(
            modify_qp_cmd(&cmd(1, 3, 0), false),
            Err(UdataError::Unsupported)
        );
        // A shorter (older) command: the rest reads as zero.
        assert_eq!(
            modify_qp_cmd(&cmd(1, 3, 0)[..8], true),
            Ok(DvModify { planes: Some(3) })
        );
        assert_eq!(modify_qp_cmd(&[1], true), Ok(DvModify { planes: Some(0) }));
    }
}
