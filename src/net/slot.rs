//! A watch's connection handed from the connector that opened it to the
//! caller that reads it: the socket for the loop's `poll(2)`, and the
//! switch that ends its waits once the response head is in.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Where a watch call's connector leaves the connection it opened, for the
/// caller to take once the call returns (one thread, and a watch agent
/// never pools, so the connection in the slot is the call's).
#[derive(Debug, Clone, Default)]
pub struct WatchSlot(Arc<Mutex<Option<Opened>>>);

impl WatchSlot {
    /// Empties the slot before a call: nothing a failed call left is taken.
    pub fn clear(&self) {
        drop(self.take());
    }

    /// The connection the last call opened, if any.
    pub fn take(&self) -> Option<Opened> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }

    pub(super) fn put(&self, opened: Opened) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(opened);
        }
    }
}

/// A watch's connection: its socket, and the switch that ends its waits.
#[derive(Debug)]
pub struct Opened {
    pub(super) fd: RawFd,
    pub(super) nonblocking: Arc<AtomicBool>,
}

impl Opened {
    /// The socket, for the loop's `poll(2)`.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The head is in: from now on the connection's reads never wait (a
    /// read with nothing to read returns `WouldBlock`); the loop reads it
    /// when its socket is readable.
    pub fn stop_waiting(&self) {
        self.nonblocking.store(true, Ordering::Relaxed);
    }
}
