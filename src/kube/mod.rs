//! Kubernetes REST: configuration, client, errors, paging.

pub mod client;
pub mod config;
pub mod error;

pub use client::Client;
pub use config::{Auth, KubeConfig, TokenSource};
pub use error::{Error, Status};
