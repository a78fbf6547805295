//! What is trusted: whether commands must be signed now, and the ratchet
//! that keeps them required once they were (docs/protocol.md, "Command
//! trust", "Fail closed").

use super::Agent;

impl Agent {
    /// Whether commands must be signed now (docs/protocol.md, "Fail closed").
    pub(super) fn signatures_required(&self) -> bool {
        crate::trust::signatures_required(
            self.me.cfg.command_signatures,
            self.me.keys.configured(),
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
