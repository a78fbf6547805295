//! How the Kubernetes client waits between two attempts of a call: a
//! [`Pause`] the caller provides (the process's one wait, which answers
//! probes and sees stop signals), defined here, beside the client that
//! uses it, so the client depends on no layer above it.

use std::time::Duration;

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The timeout passed.
    Timeout,
    /// SIGTERM or SIGINT arrived: stop gracefully.
    Stop,
}

/// Work that has not waited for this long answers the probes waiting at its
/// next [`Pause::checkpoint`].
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// A pause that serves probes and ends early on a stop signal: what the
/// Kubernetes client sleeps in between two attempts of a call.
pub trait Pause {
    /// Waits up to `timeout`; [`Wake::Stop`] when a stop was requested.
    fn pause(&self, timeout: Duration) -> Wake;

    /// Called between two steps of longer work (before every Kubernetes
    /// request): answers waiting probe requests when the last wait was
    /// [`CHECKPOINT_EVERY`] ago or more, and costs no system call otherwise.
    /// A stop signal seen here is kept for the next wait.
    fn checkpoint(&self);
}
