//! Generated hostile input, no network: heartbeat answers, commands,
//! connect answers, `Retry-After` values, error statuses and Lease objects
//! built from a seeded generator (sizes, nesting, control characters, lone
//! surrogates, huge and odd numbers) go through the same code the Manager
//! runs on what the Control Plane and the cluster send. Nothing may panic
//! (the release build aborts on a panic), every wait stays within the
//! protocol's bounds, and every command is either parsed or refused with a
//! message naming why.

use std::time::{Duration, Instant, SystemTime};

use nexo_manager::backoff::{Backoff, parse_retry_after, retry_after_delay};
use nexo_manager::commands;
use nexo_manager::cp::Retry;
use nexo_manager::cp::client::{CpError, HeartbeatAnswer};
use nexo_manager::cp::wire::ConnectResponse;
use nexo_manager::lease::{Record, decide};
use nexo_manager::refusal::Refusal;
use nexo_manager::trust::{self, Keys};

const CASES: usize = 3000;
/// What a Manager advertises (a class whose capability is not among them is
/// refused before its payload is read).
const CAPABILITIES: &[&str] = nexo_manager::agent::CAPABILITIES;

/// xorshift64*: reproducible, so a failure names its seed. `.1` is the
/// byte budget of the value being generated (about 1 MiB), so that nesting
/// and long lists stay bounded.
struct Gen(u64, usize);

const BUDGET: usize = 1 << 20;

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen(seed, BUDGET)
    }
    fn fresh(&mut self) {
        self.1 = BUDGET;
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }

    fn string(&mut self) -> String {
        let pieces = [
            "orders",
            "a",
            "",
            ".",
            "..",
            "cmd-1",
            "\\n",
            "\\r\\nINFO forged",
            "\\u0000",
            "\\ud800",
            "\\udfff\\ud800",
            "\\u001b[2J",
            "é",
            "\\u2028",
            "💥",
            "\\\"",
            "/",
            "deploy",
            "rollout",
            "upgrade",
            "uninstall",
            "shop",
            "nexo.io/v1alpha1",
            "NexoProxy",
            "ConfigMap",
            "sha256:",
            "%2e%2e",
            " ",
            "\\t",
        ];
        let n = self.below(6);
        let mut s = String::new();
        for _ in 0..n {
            s.push_str(self.pick(&pieces));
        }
        if self.below(50) == 0 {
            let n = (self.below(300_000) as usize).min(self.1);
            s.push_str(&"x".repeat(n));
        }
        self.1 = self.1.saturating_sub(s.len() + 2);
        format!("\"{s}\"")
    }

    fn number(&mut self) -> String {
        self.pick(&[
            "0",
            "-0",
            "1",
            "-1",
            "30",
            "5",
            "600",
            "601",
            "4",
            "1e400",
            "-1e400",
            "1.5",
            "18446744073709551615",
            "18446744073709551616",
            "9223372036854775807",
            "-9223372036854775808",
            "1e-400",
            "0.0000001",
            "123456789012345678901234567890",
        ])
        .to_owned()
    }

    fn value(&mut self, depth: u32) -> String {
        if depth > 140 || self.1 < 64 {
            return "null".into();
        }
        self.1 -= 8;
        match self.below(if depth > 6 { 4 } else { 9 }) {
            0 => self.string(),
            1 => self.number(),
            2 => self.pick(&["true", "false", "null"]).to_owned(),
            3 if self.below(20) == 0 => {
                // Deep nesting, past serde_json's recursion limit sometimes.
                let d = self.below(200) as usize;
                self.1 = self.1.saturating_sub(2 * d);
                format!("{}{}", "[".repeat(d), "]".repeat(d))
            }
            3 => "{}".into(),
            4 | 5 => {
                let n = if self.below(30) == 0 {
                    self.below(5000)
                } else {
                    self.below(5)
                };
                let items: Vec<String> = (0..n).map(|_| self.value(depth + 1)).collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let keys = [
                    "id",
                    "class",
                    "payload",
                    "requires",
                    "deployment",
                    "name",
                    "namespace",
                    "format",
                    "manifests",
                    "targets",
                    "imageTag",
                    "managerImage",
                    "bundleVersion",
                    "migration",
                    "adoptLegacy",
                    "apiVersion",
                    "kind",
                    "metadata",
                    "spec",
                    "commands",
                    "heartbeatIntervalSeconds",
                    "sessionToken",
                    "managerId",
                    "environmentId",
                    "expiresAt",
                    "x",
                ];
                let n = self.below(7);
                let fields: Vec<String> = (0..n)
                    .map(|_| format!("\"{}\":{}", self.pick(&keys), self.value(depth + 1)))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }
        }
    }

    /// A command that is usually close to valid, so parsing gets deep.
    fn command(&mut self) -> String {
        let class = self.pick(&["deploy", "rollout", "upgrade", "uninstall", "x"]);
        let id = if self.below(5) == 0 {
            self.string()
        } else {
            format!("\"c-{}\"", self.below(1000))
        };
        let payload = match class {
            "deploy" => format!(
                r#"{{"deployment":{{"name":{},"namespace":"shop"}},"format":{},"manifests":[{},{}]}}"#,
                self.string(),
                self.pick(&["\"crd\"", "\"legacy\"", "1", "null"]),
                self.value(0),
                r#"{"apiVersion":"nexo.io/v1alpha1","kind":"NexoProxy","metadata":{"name":"orders"},"spec":{}}"#
            ),
            "rollout" => format!(
                r#"{{"imageTag":{},"targets":{}}}"#,
                self.string(),
                self.value(1)
            ),
            "upgrade" => format!(
                r#"{{"bundleVersion":{},"managerImage":{}}}"#,
                self.value(1),
                self.string()
            ),
            _ => self.value(0),
        };
        format!(
            r#"{{"id":{id},"class":"{class}","requires":{},"payload":{payload}}}"#,
            self.value(1)
        )
    }
}

#[test]
fn generated_answers_and_commands_never_panic_and_refusals_say_why() {
    let managed = vec!["shop".to_owned()];
    let mut g = Gen::new(0x9E37_79B9_7F4A_7C15);
    let (mut parsed, mut refused, mut skipped) = (0, 0, 0);
    let started = Instant::now();
    // Fewer answers than the other tests: each is up to a few MiB.
    for case in 0..CASES / 3 {
        g.fresh();
        let n = g.below(6);
        let commands: Vec<String> = (0..n)
            .map(|_| {
                if g.below(3) == 0 {
                    g.value(0)
                } else {
                    g.command()
                }
            })
            .collect();
        let body = match g.below(10) {
            0 => g.value(0),
            1 => format!(r#"{{"heartbeatIntervalSeconds":{}}}"#, g.value(1)),
            _ => format!(
                r#"{{"heartbeatIntervalSeconds":{},"commands":[{}],"extra":{}}}"#,
                g.number(),
                commands.join(","),
                g.value(1)
            ),
        };
        let answer = HeartbeatAnswer(body.into_bytes());
        let Ok(resp) = answer.parse() else { continue };
        for raw in resp.commands.map(|c| c.taken).unwrap_or_default() {
            match commands::parse(raw.get(), CAPABILITIES, &managed) {
                Ok(_) => parsed += 1,
                Err(Refusal::NoId(why)) => {
                    skipped += 1;
                    let start: String = why.chars().take(300).collect();
                    assert!(
                        why.len() < 1024,
                        "case {case}: a {}-byte reason: {start}",
                        why.len()
                    );
                }
                Err(refusal) => {
                    refused += 1;
                    let message = refusal.to_string();
                    let id = commands::command_id(raw.get()).unwrap_or_default();
                    assert!(
                        [
                            "unsupported class",
                            "unsupported capability",
                            "invalid payload"
                        ]
                        .iter()
                        .any(|p| message.starts_with(p)),
                        "case {case}: refusal of {id} without its reason: {message}"
                    );
                    assert!(
                        message.len() < 4096,
                        "case {case}: a {}-byte message",
                        message.len()
                    );
                    assert!(
                        !message.contains(&"x".repeat(100)),
                        "case {case}: quotes a long value: {}",
                        message.chars().take(300).collect::<String>()
                    );
                }
            }
        }
    }
    println!(
        "{} answers in {:?}: {parsed} commands parsed, {refused} refused, {skipped} without an id",
        CASES / 3,
        started.elapsed()
    );
    assert!(
        parsed > 0 && refused > 30 && skipped > 30,
        "the generator reaches every outcome"
    );
}

#[test]
fn generated_signed_envelopes_and_key_files_never_panic_and_are_refused() {
    let mut g = Gen::new(11);
    let keys = Keys::parse("k1 WGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY=").unwrap();
    let now = std::time::SystemTime::now();
    for _ in 0..CASES {
        g.fresh();
        // Envelopes of generated fields, some of them base64url-looking.
        let signed = if g.0.is_multiple_of(3) {
            "\"eyJpZCI6ImNtZC0xIn0\"".to_owned()
        } else {
            g.value(2)
        };
        let raw = format!(
            r#"{{"id":"cmd-1","keyId":{},"signed":{},"signature":{}}}"#,
            g.value(1),
            signed,
            g.value(1)
        );
        // Nothing signed by k1's key (the base point: no one holds its seed) can verify: each is refused.
        let verdict = trust::verify(&raw, "cmd-1", Some(&keys), true, "env-a", now);
        assert!(verdict.is_err(), "{raw}");
        // Without keys, the same never panics either.
        let _ = trust::verify(&raw, "cmd-1", None, false, "env-a", now);
        // Key files of generated lines.
        let file = format!("{} {}\n{}", g.string(), g.string(), g.value(1));
        let _ = Keys::parse(&file);
    }
}

#[test]
fn generated_connect_answers_never_panic() {
    let mut g = Gen::new(7);
    for _ in 0..CASES {
        g.fresh();
        let body = format!(
            r#"{{"sessionToken":{},"managerId":{},"environmentId":{},"expiresAt":{},"heartbeatIntervalSeconds":{}}}"#,
            g.string(),
            g.string(),
            g.value(1),
            g.string(),
            g.number()
        );
        let _ = serde_json::from_str::<ConnectResponse>(&body);
    }
}

#[test]
fn generated_retry_after_and_statuses_keep_every_wait_within_bounds() {
    let mut g = Gen::new(42);
    let now = SystemTime::now();
    let values = [
        "0",
        "1",
        "-1",
        "600",
        "601",
        "18446744073709551615",
        "18446744073709551616",
        "1.5",
        "",
        " ",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Wed, 99 Foo 2026 99:99:99 GMT",
        "\u{0}",
        "1e9",
        "99999999999999999999999999",
        "Mon, 01 Jan 10000 00:00:00 GMT",
    ];
    let mut backoff = Backoff::control_plane();
    for _ in 0..CASES {
        let v = g.pick(&values);
        let parsed = parse_retry_after(v, now);
        if let Some(d) = parsed {
            assert!(d <= Duration::from_secs(600), "{v:?} parsed as {d:?}");
        }
        let wait = retry_after_delay(parsed, &mut backoff);
        assert!(
            wait >= Duration::from_secs(1) && wait <= Duration::from_secs(600),
            "{v:?}: waits {wait:?}"
        );
        let status = [
            200u16, 400, 401, 404, 409, 422, 429, 500, 502, 503, 504, 599, 0, 999,
        ][g.below(14) as usize];
        let err = CpError::Status {
            status,
            code: Some(g.string()),
            message: Some(g.string()),
            retry_after: parsed,
        };
        if let Retry::After(d) = err.retry(&mut backoff) {
            assert!(
                d <= Duration::from_secs(600),
                "status {status}, Retry-After {v:?}: waits {d:?}"
            );
            if matches!(status, 429 | 503) {
                assert!(d >= Duration::from_secs(1), "status {status}, {v:?}: {d:?}");
            }
        }
        if g.below(10) == 0 {
            backoff.reset();
        }
    }
}

#[test]
fn generated_lease_objects_never_panic() {
    let mut g = Gen::new(3);
    let now = Instant::now();
    for _ in 0..CASES {
        let body = format!(
            r#"{{"spec":{{"holderIdentity":{},"leaseDurationSeconds":{},"renewTime":{},"leaseTransitions":{}}}}}"#,
            g.string(),
            g.number(),
            g.string(),
            g.number()
        );
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
            continue;
        };
        let r = Record::from_object(&v);
        let _ = decide(
            Some(&r),
            "me",
            now,
            now + Duration::from_secs(g.below(1 << 40)),
        );
    }
}
