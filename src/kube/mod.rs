//! Kubernetes REST: configuration, client, errors, paging.

pub mod changes;
pub mod client;
pub mod config;
pub mod error;
mod limits;
pub mod listing;
pub mod pause;
mod query;
pub mod verbs;
pub mod watch;

pub use client::Client;
pub use config::KubeConfig;
pub use error::Error;
pub use verbs::ApplyParams;
