//! Acknowledgement delivery: the ack body from a ledger entry, and the
//! retry schedule (5 attempts in all: waits of 0.5 s, 1 s, 2 s, 4 s, each
//! with ±25 % jitter). After the last attempt an ack waits in `pendingAcks`.

use std::time::Duration;

use crate::backoff::Jitter;
use crate::cp::wire::Ack;
use crate::state::LedgerEntry;

/// Delivery attempts before an ack moves to `pendingAcks`.
pub const ATTEMPTS: u32 = 5;

/// The wait after failed attempt `n` (from 1): 0.5 s × 2^(n-1), ±25 %.
pub fn delay(n: u32, jitter: &mut Jitter) -> Duration {
    let base = Duration::from_millis(500) * 2u32.pow(n.saturating_sub(1).min(8));
    base.mul_f64(0.75 + 0.5 * jitter.fraction())
}

/// The ack of a ledger entry.
pub fn ack(entry: &LedgerEntry, manager_id: &str, attempt: u32) -> Ack {
    Ack {
        manager_id: manager_id.to_owned(),
        command_id: entry.command_id.clone(),
        result: entry.result,
        message: if entry.more_resources.is_empty() {
            entry.message.clone()
        } else {
            let rest: Vec<String> = entry
                .more_resources
                .iter()
                .map(|(action, n)| format!("{n} {action}"))
                .collect();
            let n: u64 = entry.more_resources.values().sum();
            format!(
                "{} ({n} more resources not listed: {})",
                entry.message,
                rest.join(", ")
            )
        },
        completed_at: entry.completed_at.clone(),
        attempt,
        resources: entry.resources.clone(),
        plan: entry.plan.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_doubles_from_half_a_second_with_bounded_jitter() {
        let mut j = Jitter::seeded(9);
        for (n, base) in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0)] {
            for _ in 0..50 {
                let d = delay(n, &mut j).as_secs_f64();
                assert!(d >= base * 0.75 && d <= base * 1.25, "attempt {n}: {d}");
            }
        }
    }
}
