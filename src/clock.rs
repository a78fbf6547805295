//! A clock that keeps counting while the process is stopped (SIGSTOP, a
//! throttled cgroup) and while the machine is suspended (a frozen VM):
//! `CLOCK_BOOTTIME`. Rust's `Instant` is `CLOCK_MONOTONIC`, which does not
//! count a suspended machine. The lease fence measures the age of the last
//! renewal with it (`lease.rs`). A leaf module.

use std::time::Duration;

/// A point in time since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Now, or `None` when the clock cannot be read (the caller then
    /// assumes the worst).
    pub fn now() -> Option<BootInstant> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec that lives across the
        // call; clock_gettime(2) only writes it, and CLOCK_BOOTTIME is a
        // clock id Linux has had since 2.6.39.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        if rc != 0 || ts.tv_sec < 0 || ts.tv_nsec < 0 {
            return None;
        }
        Some(BootInstant(
            Duration::from_secs(ts.tv_sec as u64) + Duration::from_nanos(ts.tv_nsec as u64),
        ))
    }

    /// A point `d` after this one.
    pub fn after(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }

    /// The time from `earlier` to this point (zero if `earlier` is later).
    pub fn since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_moves_forward_with_time() {
        let a = BootInstant::now().expect("CLOCK_BOOTTIME");
        std::thread::sleep(Duration::from_millis(20));
        let b = BootInstant::now().expect("CLOCK_BOOTTIME");
        assert!(b.since(a) >= Duration::from_millis(20), "{a:?} {b:?}");
        assert_eq!(a.since(b), Duration::ZERO);
        assert_eq!(
            a.after(Duration::from_secs(1)).since(a),
            Duration::from_secs(1)
        );
    }
}
