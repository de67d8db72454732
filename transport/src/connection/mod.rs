//! A connection between two devices: its paths below, its streams above.

pub mod path;
pub mod retransmit;
pub mod rtt;
pub mod sack;
pub mod timer;
