//! What is trusted: the command keys (read again when their file
//! changes), whether commands must be signed now, and the ratchet that
//! keeps them required once they were (docs/protocol.md, "Command trust",
//! "Fail closed").

use super::Agent;
use crate::trust::KeyFile;

/// The trust part's own state: the command keys.
pub(super) struct Trusted {
    pub(super) keys: KeyFile,
}

impl Agent {
    /// The keys as their file says now (rotated by rewriting it), and the
    /// ratchet recorded.
    pub(super) fn refresh_trust(&mut self) {
        self.trusted.keys.refresh();
        self.ratchet_signatures();
    }

    /// Whether commands must be signed now (docs/protocol.md, "Fail closed").
    pub(super) fn signatures_required(&self) -> bool {
        crate::trust::signatures_required(
            self.me.cfg.command_signatures,
            self.trusted.keys.configured(),
            self.store.signatures_required(),
        )
    }

    /// Once required, signatures stay required: recorded in the state, so
    /// that a key file that disappears or a restart without it never
    /// re-opens the door; only `NEXO_COMMAND_SIGNATURES=off` clears it.
    pub(super) fn ratchet_signatures(&mut self) {
        let off = self.me.cfg.command_signatures == crate::config::Signatures::Off;
        let required = !off && self.signatures_required();
        self.store.require_signatures(&self.link.kube, required);
    }
}
