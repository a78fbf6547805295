//! How much the Kubernetes client reads, and how long a call may take
//! when its caller has a budget of its own: plain values and the rules
//! that pick them.

use std::time::Duration;

use ureq::http::{Method, Request};

/// Largest response body read from the API server (an object, a write's
/// answer; a page of a list has [`MAX_PAGE_BODY`]): the same as the
/// Control Plane's, so that with the heartbeat body and the state document
/// it fits the pod's 32 MiB limit. An object is at most 1.5 MiB (etcd's
/// request limit); a body over it is refused (`TooLarge`), not retried.
pub const MAX_BODY: u64 = 8 * 1024 * 1024;

/// Largest page of a list read (a GET whose query starts with `limit`,
/// as every page the client asks does): items are counted by the API
/// server, not bytes, so a page over this is asked again with fewer
/// items (`verbs::smaller`); one item always fits (an object is at most
/// 1.5 MiB). A quarter of [`MAX_BODY`]: a namespace of big Secrets is
/// read in pages that keep the check's memory small.
pub const MAX_PAGE_BODY: u64 = 2 * 1024 * 1024;

/// The longest line (one event) a watch may send: an object is at most
/// 1.5 MiB in etcd; anything longer is not a Kubernetes watch. A watch is
/// a stream with no whole-body bound; each of its lines has this one.
pub const MAX_EVENT: usize = 4 * 1024 * 1024;

/// `req` with `timeout` as its whole call's, when given.
pub(super) fn within<S: ureq::AsSendBody>(
    agent: &ureq::Agent,
    req: Request<S>,
    timeout: Option<Duration>,
) -> Request<S> {
    match timeout {
        Some(t) => agent.configure_request(req).timeout_global(Some(t)).build(),
        None => req,
    }
}

/// The read limit of a 2xx body: [`MAX_PAGE_BODY`] for a page of a list,
/// [`MAX_BODY`] for anything else.
pub(super) fn read_limit(method: &Method, path: &str) -> u64 {
    let page = path
        .split_once('?')
        .is_some_and(|(_, query)| query.starts_with("limit="));
    if *method == Method::GET && page {
        MAX_PAGE_BODY
    } else {
        MAX_BODY
    }
}

/// How much of an error body is read (a `Status` is small; a longer page,
/// a proxy's say, is cut here and still reported with its status).
pub const MAX_ERROR_BODY: u64 = 64 * 1024;

/// Capacity of the read buffer kept between calls: a page of 100 typical
/// items fits; a larger page grows it for that call only.
pub const SCRATCH_KEEP: usize = 256 * 1024;
