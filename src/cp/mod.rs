//! The Control Plane: wire types, the HTTPS client, egress proxy rules.

pub mod body;
pub mod client;
mod error;
pub mod proxy;
mod tls;
pub mod wire;

pub use client::{AckOutcome, CaBundle, CaReread, CpClient, CpError, MAX_CA_BUNDLE, Retry};
