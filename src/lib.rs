//! Nexo Manager: the in-cluster agent of a Nexo environment.
//!
//! What it does: it connects outbound to the hosted Nexo Control Plane,
//! binds to the cluster with an environment-bound connect token, heartbeats
//! its inventory, and applies the commands it receives (deploy, rollout,
//! upgrade, uninstall) through the Kubernetes REST API, acknowledging each.
//!
//! What it does not do: it is never in the MongoDB traffic path, it accepts
//! no inbound connection but its probe endpoint, and it never touches a
//! Kubernetes object it does not own.
//!
//! One synchronous thread, no async runtime. See `ARCHITECTURE.md`.

#![deny(unsafe_code)]
// No panic is reachable from input (docs/protocol.md, "Hostile and buggy
// values"): outside tests, no unwrap, expect, panic or unreachable at all.
// tests/source_rules.rs checks the same without clippy.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

pub(crate) mod acks;
pub mod agent;
pub mod apply;
pub mod backoff;
pub mod clock;
pub mod commands;
pub mod config;
pub mod cp;
pub mod drift;
pub mod events;
pub(crate) mod fatal;
pub(crate) mod files;
pub mod image;
pub mod integrity;
pub(crate) mod inventory;
pub mod kube;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod names;
pub(crate) mod net;
pub mod ownership;
pub mod policy;
pub(crate) mod probe;
pub mod refusal;
pub mod release;
pub(crate) mod resolve;
pub mod resource;
pub(crate) mod secret;
pub(crate) mod self_rollout;
pub mod semver;
pub mod state;
pub(crate) mod strict_json;
pub mod text;
pub(crate) mod tls;
pub(crate) mod token;
pub mod trust;
pub mod wait;
pub mod words;

/// The Manager's version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The build identifier, set at compile time through `NEXO_BUILD`
/// (for example `20261202.1-abc1234`); `dev` otherwise.
pub const BUILD: &str = match option_env!("NEXO_BUILD") {
    Some(b) => b,
    None => "dev",
};

/// `User-Agent` of every request: `nexo-manager/<version>`.
pub const USER_AGENT: &str = concat!("nexo-manager/", env!("CARGO_PKG_VERSION"));
