//! Backoff: exponential with full jitter, and `Retry-After`.
//!
//! Pure values: the caller owns the clock and the sleeping.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A small xorshift generator for jitter; not for secrets.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the clock and the process id.
    pub fn from_entropy() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Jitter::seeded(nanos ^ (u64::from(std::process::id()) << 32))
    }

    /// A fixed seed, for tests.
    pub fn seeded(seed: u64) -> Self {
        Jitter(seed | 1)
    }

    /// A uniform fraction in [0, 1).
    pub fn fraction(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Exponential backoff with full jitter: attempt `n` (from 0) waits a
/// uniform time in [0, min(cap, base * 2^n)].
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
    jitter: Jitter,
}

impl Backoff {
    /// The Control Plane's policy: base 1 s, cap 5 min.
    pub fn control_plane() -> Self {
        Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Jitter::from_entropy(),
        )
    }

    /// A policy with its own base, cap and jitter source.
    pub fn new(base: Duration, cap: Duration, jitter: Jitter) -> Self {
        Backoff {
            base,
            cap,
            failures: 0,
            jitter,
        }
    }

    /// The ceiling of the next wait (before jitter).
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.failures.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Records a failure and returns how long to wait before the next try.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        ceiling.mul_f64(self.jitter.fraction())
    }

    /// Records a failure and returns how long to wait before the next try,
    /// at least half the ceiling ("equal jitter"): for what may fail at
    /// once again and again (a watch that ends as soon as it is opened),
    /// where full jitter's waits near zero would add up to a flood.
    pub fn next_delay_at_least_half(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        ceiling.mul_f64(0.5 + 0.5 * self.jitter.fraction())
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a success: the next failure starts from the base again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Parses `Retry-After`: delay-seconds or an HTTP date (IMF-fixdate),
/// relative to `now`. A date in the past means no wait.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Some(secs) = whole_number(value) {
        return Some(Duration::from_secs(secs).min(RETRY_AFTER_MAX));
    }
    let at = parse_http_date(value)?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(RETRY_AFTER_MAX),
    )
}

/// A whole number of any number of digits (one past `u64` is `u64::MAX`,
/// as long as any cap); `None` for anything else (a sign, a fraction, an
/// exponent, nothing). The rule of the CP's numbers of seconds.
pub fn whole_number(text: &str) -> Option<u64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().unwrap_or(u64::MAX))
}

/// The shortest wait a `Retry-After` can ask for (docs/protocol.md, "Hostile and
/// buggy values").
pub const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
/// The longest wait a `Retry-After` can ask for.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(600);

/// An answer's `Retry-After` as a wait from now ([`parse_retry_after`]
/// against the wall clock): the one reading of the header, for both
/// clients. `None` when absent, not text, or not a value.
pub fn retry_after_of(headers: &ureq::http::HeaderMap) -> Option<Duration> {
    headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()))
}

/// The wait after an answer that asked to be retried later, never over
/// `cap`: its `Retry-After` within [[`RETRY_AFTER_MIN`],
/// [`RETRY_AFTER_MAX`]]; when absent, zero, past or unparsable, the
/// backoff's next delay but at least [`RETRY_AFTER_MIN`]. The backoff
/// advances either way, as for any failure; the wait counted in
/// `nexo_manager_retry_after_*` (when there was a `Retry-After`) is the one
/// returned, the cap applied.
pub fn retry_after_wait(
    retry_after: Option<Duration>,
    backoff: &mut Backoff,
    cap: Duration,
) -> Duration {
    let backoff_delay = backoff.next_delay();
    let delay = match retry_after {
        Some(d) if d >= RETRY_AFTER_MIN => d.min(RETRY_AFTER_MAX),
        _ => backoff_delay.max(RETRY_AFTER_MIN),
    }
    .min(cap);
    if retry_after.is_some() {
        crate::metrics::retry_after(delay);
    }
    delay
}

/// [`retry_after_wait`] within the protocol's [`RETRY_AFTER_MAX`]: the wait
/// after a 429 or 503.
pub fn retry_after_delay(retry_after: Option<Duration>, backoff: &mut Backoff) -> Duration {
    retry_after_wait(retry_after, backoff, RETRY_AFTER_MAX)
}

/// IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
fn parse_http_date(s: &str) -> Option<SystemTime> {
    let rest = s.split_once(", ")?.1;
    let mut parts = rest.split(' ');
    let day: u64 = parts.next()?.parse().ok()?;
    let month_name = parts.next()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == month_name)? as u64
        + 1;
    let year: u64 = parts.next()?.parse().ok()?;
    if year > 9999 {
        return None;
    }
    let mut hms = parts.next()?.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if parts.next()? != "GMT"
        || !(1..=31).contains(&day)
        || h > 23
        || m > 59
        || sec > 60
        || year < 1970
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3600 + m * 60 + sec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_the_exponential_ceiling_and_cap() {
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Jitter::seeded(7),
        );
        let mut ceilings = Vec::new();
        for _ in 0..12 {
            let ceiling = b.ceiling();
            let d = b.next_delay();
            assert!(d <= ceiling, "{d:?} > {ceiling:?}");
            ceilings.push(ceiling.as_secs());
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_secs(1));
    }

    #[test]
    fn jitter_spreads() {
        let mut j = Jitter::seeded(42);
        let xs: Vec<f64> = (0..1000).map(|_| j.fraction()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "mean {mean}");
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Wed, 02 Dec 2026 14:20:00 GMT", UNIX_EPOCH),
            Some(RETRY_AFTER_MAX),
            "a date decades ahead waits 10 minutes"
        );
        assert_eq!(
            parse_retry_after(
                "Wed, 02 Dec 2026 14:20:00 GMT",
                UNIX_EPOCH + Duration::from_secs(1_796_221_200 - 42)
            ),
            Some(Duration::from_secs(42))
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn retry_after_is_bounded_whatever_the_value() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        for huge in [
            "18446744073709551615",
            "99999999999999999999999999",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            assert_eq!(
                parse_retry_after(huge, now),
                Some(RETRY_AFTER_MAX),
                "{huge}"
            );
        }
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 99999 08:00:00 GMT", now),
            None
        );
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Jitter::seeded(7),
        );
        // Zero, a past date, an unparsable value: at least 1 s, the backoff advances.
        assert!(retry_after_delay(Some(Duration::ZERO), &mut b) >= RETRY_AFTER_MIN);
        assert!(retry_after_delay(None, &mut b) >= RETRY_AFTER_MIN);
        assert_eq!(b.failures(), 2);
        assert_eq!(
            retry_after_delay(Some(Duration::from_secs(7)), &mut b),
            Duration::from_secs(7)
        );
        assert_eq!(
            retry_after_delay(Some(Duration::from_secs(86_400)), &mut b),
            RETRY_AFTER_MAX
        );
        assert_eq!(
            b.failures(),
            4,
            "consecutive 429/503 answers advance the backoff"
        );
    }

    #[test]
    fn a_capped_wait_is_counted_as_the_wait_taken() {
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(30),
            Jitter::seeded(1),
        );
        let before = crate::metrics::tests::retry_after_seconds();
        let wait = retry_after_wait(
            Some(Duration::from_secs(600)),
            &mut b,
            Duration::from_secs(10),
        );
        assert_eq!(wait, Duration::from_secs(10));
        assert!(
            (crate::metrics::tests::retry_after_seconds() - before - 10.0).abs() < 1e-6,
            "counted {} s for a 10 s wait",
            crate::metrics::tests::retry_after_seconds() - before
        );
        // Uncapped, the protocol's bound.
        let wait = retry_after_delay(Some(Duration::from_secs(7200)), &mut b);
        assert_eq!(wait, RETRY_AFTER_MAX);
    }
}
