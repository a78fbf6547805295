//! Why a command was refused, every reason in one enum ([`Refusal`]), as
//! rustls's `PeerMisbehaved` does it: each reason a variant with its data,
//! `Display` giving the protocol's ack message exactly. The ledger, the
//! metrics and the tests branch on the variant, never on the text.
//!
//! A refused command changes nothing in the cluster.

use std::fmt;

use crate::policy::Violation;
use crate::trust::Untrusted;

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable id: the command cannot be acknowledged; it is logged and
    /// skipped. The text says what is wrong, never the command.
    NoId(String),
    /// `unsupported class: …`: the class (cut), `(missing)`, or the raw
    /// value that is not a string.
    UnsupportedClass(String),
    /// `unsupported capability: …`: a `requires` entry not advertised.
    UnsupportedCapability(String),
    /// `invalid payload: too large: …`: over the raw or parsed budget.
    TooLarge(String),
    /// `invalid payload: …`: what is wrong and where.
    InvalidPayload(String),
    /// Command trust: a signature missing, not verifying, out of its window.
    Untrusted(Untrusted),
    /// The content policy: `policy: …`.
    Policy(Violation),
    /// One of the Manager's own objects is named (docs/protocol.md, "Ownership").
    OwnObject {
        /// Its kind.
        kind: String,
        /// Its name, escaped when shown.
        name: String,
        /// The object of the command that names it, when the command does
        /// not write it itself (a NexoProxy's Secret reference).
        named_by: Option<String>,
    },
    /// Objects this environment or deployment does not own, or read
    /// without what a guarded write needs: each with its reason.
    NotOwned {
        /// What the command would have done.
        nothing: Nothing,
        /// `<object> <why>`, one per refused object.
        reasons: Vec<String>,
    },
    /// An upgrade to an older bundle without `allowDowngrade`.
    Downgrade {
        /// The running bundle version.
        running: String,
        /// The one asked for.
        to: String,
    },
}

/// What a refused command left undone: `refused, nothing applied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nothing {
    /// A deploy's writes.
    Applied,
    /// A rollout's image changes.
    Changed,
    /// An uninstall's deletes.
    Deleted,
}

impl Nothing {
    fn as_str(self) -> &'static str {
        match self {
            Nothing::Applied => "applied",
            Nothing::Changed => "changed",
            Nothing::Deleted => "deleted",
        }
    }
}

impl Refusal {
    /// The `reason` label of `nexo_manager_commands_refused_total`: a closed
    /// set, so that a CP cannot grow the registry.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoId(_) => "no_id",
            Refusal::UnsupportedClass(_) => "unsupported_class",
            Refusal::UnsupportedCapability(_) => "unsupported_capability",
            Refusal::TooLarge(_) => "too_large",
            Refusal::InvalidPayload(_) => "invalid_payload",
            Refusal::Untrusted(_) => "signature",
            Refusal::Policy(_) => "policy",
            Refusal::OwnObject { .. } | Refusal::NotOwned { .. } => "ownership",
            Refusal::Downgrade { .. } => "downgrade",
        }
    }

    /// Whether the refused command is recorded in the ledger: not when it
    /// was refused before any signature verified (docs/protocol.md, "Command
    /// trust"), nor without an id.
    pub fn recorded(&self) -> bool {
        match self {
            Refusal::NoId(_) => false,
            Refusal::Untrusted(u) => !u.before_verification(),
            _ => true,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoId(why) => f.write_str(why),
            Refusal::UnsupportedClass(class) => write!(f, "unsupported class: {class}"),
            Refusal::UnsupportedCapability(c) => write!(f, "unsupported capability: {c}"),
            Refusal::TooLarge(why) => write!(f, "invalid payload: too large: {why}"),
            Refusal::InvalidPayload(why) => write!(f, "invalid payload: {why}"),
            Refusal::Untrusted(u) => u.fmt(f),
            Refusal::Policy(v) => v.fmt(f),
            Refusal::OwnObject {
                kind,
                name,
                named_by,
            } => {
                let name = crate::text::escape(name);
                write!(f, "refused: the Manager's own object {kind}/{name}")?;
                match named_by {
                    Some(by) => write!(f, "; {by} names it"),
                    None => Ok(()),
                }
            }
            Refusal::NotOwned { nothing, reasons } => {
                write!(
                    f,
                    "refused, nothing {}: {}",
                    nothing.as_str(),
                    reasons.join("; ")
                )
            }
            Refusal::Downgrade { running, to } => write!(f, "downgrade: {running} to {to}"),
        }
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_a_known_label_of_the_refused_counter() {
        let all = [
            Refusal::NoId(String::new()),
            Refusal::UnsupportedClass(String::new()),
            Refusal::UnsupportedCapability(String::new()),
            Refusal::TooLarge(String::new()),
            Refusal::InvalidPayload(String::new()),
            Refusal::Untrusted(crate::trust::Untrusted::Unsigned),
            Refusal::Policy(crate::policy::Violation(String::new())),
            Refusal::NotOwned {
                nothing: Nothing::Applied,
                reasons: Vec::new(),
            },
            Refusal::Downgrade {
                running: String::new(),
                to: String::new(),
            },
        ];
        let reasons: Vec<&str> = all.iter().map(Refusal::reason).collect();
        assert_eq!(
            reasons,
            crate::metrics::REFUSAL_REASONS,
            "present at zero, in this order"
        );
    }

    #[test]
    fn each_reason_says_the_protocols_words() {
        let cases = [
            (
                Refusal::UnsupportedClass("teleport".into()),
                "unsupported class: teleport",
                "unsupported_class",
            ),
            (
                Refusal::UnsupportedCapability("x.v9".into()),
                "unsupported capability: x.v9",
                "unsupported_capability",
            ),
            (
                Refusal::TooLarge("3 MiB".into()),
                "invalid payload: too large: 3 MiB",
                "too_large",
            ),
            (
                Refusal::InvalidPayload("no name".into()),
                "invalid payload: no name",
                "invalid_payload",
            ),
            (
                Refusal::Untrusted(Untrusted::BadSignature),
                &Untrusted::BadSignature.to_string(),
                "signature",
            ),
            (
                Refusal::Policy(Violation("a: b".into())),
                "policy: a: b",
                "policy",
            ),
            (
                Refusal::OwnObject {
                    kind: "Secret".into(),
                    name: "state\n".into(),
                    named_by: None,
                },
                "refused: the Manager's own object Secret/state\\n",
                "ownership",
            ),
            (
                Refusal::OwnObject {
                    kind: "Secret".into(),
                    name: "s".into(),
                    named_by: Some("NexoProxy shop/p".into()),
                },
                "refused: the Manager's own object Secret/s; NexoProxy shop/p names it",
                "ownership",
            ),
            (
                Refusal::NotOwned {
                    nothing: Nothing::Deleted,
                    reasons: vec!["a x".into(), "b y".into()],
                },
                "refused, nothing deleted: a x; b y",
                "ownership",
            ),
            (
                Refusal::Downgrade {
                    running: "0.4.0".into(),
                    to: "0.3.0".into(),
                },
                "downgrade: 0.4.0 to 0.3.0",
                "downgrade",
            ),
        ];
        for (refusal, text, reason) in cases {
            assert_eq!(refusal.to_string(), text);
            assert_eq!(refusal.reason(), reason, "{refusal:?}");
        }
    }

    #[test]
    fn refusals_before_verification_are_not_recorded() {
        assert!(!Refusal::Untrusted(Untrusted::Unsigned).recorded());
        assert!(Refusal::Untrusted(Untrusted::IdMismatch("x".into())).recorded());
        assert!(!Refusal::NoId("no id".into()).recorded());
        assert!(Refusal::InvalidPayload("x".into()).recorded());
    }
}
