//! Drift records (protocol.md, `drift.v1`), written: what a deploy or
//! rollout applied, kept after it in a Secret owned by the deployment and
//! carrying the Manager's proof (SECURITY.md, "Integrity the namespace
//! cannot forge"); deleted with the deployment's uninstall.

use serde_json::Value;

use super::Agent;
use crate::apply::Outcome;
use crate::commands::{Action, Command};
use crate::cp::wire::AckResult;
use crate::drift;
use crate::kube::ApplyParams;
use crate::resource::SECRETS;

impl Agent {
    /// After a command applied: a deploy's record written, a rollout's
    /// image kept in its records, an uninstalled deployment forgotten.
    pub(super) fn record_applied(&mut self, command: &Command, outcome: &Outcome) {
        if outcome.result != AckResult::Applied {
            return;
        }
        // A command about a deployment is a change: a failed enforcement
        // of it may be tried again.
        match &command.action {
            Action::Deploy(d) => {
                self.forget_refusal(&d.deployment.namespace, &d.deployment.name);
                let primary = d.format.primary();
                let owner = outcome.workloads.iter().find(|w| {
                    w.kind == primary.name()
                        && w.name == d.deployment.name
                        && w.namespace == d.deployment.namespace
                });
                let Some(uid) = owner.and_then(|w| w.uid.as_deref()) else {
                    log::warn!(
                        "drift: no uid for the {primary} of {}; what it applied is not recorded",
                        d.deployment.name
                    );
                    return;
                };
                let payload = d.record_payload();
                self.write_record(
                    &d.deployment.namespace,
                    &d.deployment.name,
                    &payload,
                    (primary.name(), uid),
                    false,
                );
            }
            Action::Rollout(_) => {
                for w in &outcome.workloads {
                    self.forget_refusal(&w.namespace, &w.name);
                    if let (Some(image), Some(uid)) = (&w.image, &w.uid) {
                        self.record_rollout(&w.namespace, &w.name, image, uid);
                    }
                }
            }
            Action::Uninstall(t) => {
                self.forget_refusal(&t.namespace, &t.name);
                self.drift.report.forget(&t.namespace, &t.name);
                self.delete_record(&t.namespace, &t.name);
            }
            Action::Upgrade(_) => {}
        }
    }

    /// The record of `namespace/name` (its path, the Secret and its
    /// payload), only when it is this Manager's: labelled as a record of
    /// this environment and carrying a valid proof (a record that is not
    /// is never changed nor deleted; the garbage collector removes one
    /// from 0.4 with its owner). What stops it is logged, with what it was
    /// read `for_what`.
    fn read_record(
        &self,
        namespace: &str,
        name: &str,
        for_what: &str,
    ) -> Option<(String, Value, Value)> {
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let env = self.me.token.environment_id();
        let secret = match self.link.kube.get_opt::<Value>(&path) {
            Ok(Some(s)) if drift::is_record(&s, env) => s,
            Ok(_) => return None,
            Err(e) => {
                log::warn!("drift: cannot read the record of {namespace}/{name} {for_what}: {e}");
                return None;
            }
        };
        let key = self.integrity.as_ref()?;
        match drift::proven_payload(&secret, env, namespace, key) {
            Ok(payload) => Some((path, secret, payload)),
            Err(e) => {
                log::warn!(
                    "drift: the record of {namespace}/{name} is not the Manager's ({e}); left alone, not read {for_what}"
                );
                None
            }
        }
    }

    /// Deletes a deployment's record after its uninstall (protocol.md,
    /// `drift.v1`: the garbage collector would, but a finalizer may hold
    /// it); only this Manager's record, as read.
    fn delete_record(&mut self, namespace: &str, name: &str) {
        let Some((path, secret, _)) = self.read_record(namespace, name, "to delete it") else {
            return;
        };
        let Some(read_at) = crate::apply::plan::ReadAt::of(&secret) else {
            return;
        };
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        match self.link.writer.delete_if(&path, "Background", guard) {
            Ok(_) => log::debug!("drift: the record of {namespace}/{name} deleted with it"),
            Err(e) if e.is_not_found() => {}
            Err(e) => log::warn!("drift: cannot delete the record of {namespace}/{name}: {e}"),
        }
    }

    /// Keeps a rollout's image in the deployment's record, so that
    /// enforcing it never rolls back; only a record the Manager wrote is
    /// carried forward (a rollout never launders a forged one into a
    /// proven one).
    fn record_rollout(&mut self, namespace: &str, name: &str, image: &str, uid: &str) {
        let Some((_, _, mut payload)) = self.read_record(namespace, name, "to keep its image")
        else {
            return;
        };
        let manifests = payload["manifests"].as_array_mut().into_iter().flatten();
        for m in manifests {
            if m["kind"] == "NexoProxy" && m["metadata"]["name"] == name {
                m["spec"]["image"] = Value::String(image.to_owned());
            }
        }
        self.write_record(namespace, name, &payload, ("NexoProxy", uid), true);
    }

    /// Writes a record, unless a Secret of its name that is not one is in
    /// the way (never touched); `read_as_record`: the caller has just read
    /// it and found it one, so it is not read again.
    fn write_record(
        &mut self,
        namespace: &str,
        name: &str,
        payload: &Value,
        owner: (&str, &str),
        read_as_record: bool,
    ) {
        let env = self.me.token.environment_id();
        let Some(key) = &self.integrity else {
            log::warn!(
                "drift: no integrity key (the state secret could not be read or written); what {namespace}/{name} applied is not recorded"
            );
            return;
        };
        let Some(secret) = drift::record_secret(payload, namespace, name, env, owner, key) else {
            log::warn!(
                "drift: what {namespace}/{name} applied is over {} bytes; not recorded, its drift not checked",
                drift::MAX_RECORD_BYTES
            );
            return;
        };
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let in_the_way = if read_as_record {
            Ok(None)
        } else {
            self.link.kube.get_opt::<Value>(&path)
        };
        match in_the_way {
            Ok(Some(other)) if !drift::is_record(&other, env) => {
                log::warn!(
                    "drift: Secret {namespace}/{} is not this Manager's record; left alone, the drift of {name} is not checked",
                    drift::record_name(name)
                );
                return;
            }
            Ok(_) => {}
            Err(e) => {
                log::warn!("drift: cannot read {path}: {e}; what {name} applied is not recorded");
                return;
            }
        }
        if let Err(e) = self
            .link
            .writer
            .apply(&path, &secret, ApplyParams::WRITE.forced(true))
        {
            log::warn!("drift: cannot write the record of {namespace}/{name}: {e}");
        }
    }
}
