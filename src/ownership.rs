//! Ownership: the labels and the proof every Manager-written object
//! carries, how an existing object is classified by them ([`Verifier`],
//! which the drift check and the inventory ask), and the one verdict every
//! planner decides from ([`Judge::verdict`]: the Manager's own, the
//! deployment's, or neither and why).

use crate::integrity::{self, Key, ObjectClaim};
use crate::refusal::Refusal;
use serde_json::Value;

/// `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY`] on owned objects.
pub const MANAGER: &str = "nexo-manager";
/// `nexo.io/owner-id`: the environment id.
pub const OWNER_ID: &str = "nexo.io/owner-id";
/// `nexo.io/deployment`: the deployment name.
pub const DEPLOYMENT: &str = "nexo.io/deployment";
/// `app.kubernetes.io/part-of`: `nexo` on objects of the 0.2.0 line.
pub const PART_OF: &str = "app.kubernetes.io/part-of";

/// `app.kubernetes.io/name`: `nexo-manager` on every object of the
/// Manager's own installation (its Deployment, Secrets, RBAC).
pub const NAME: &str = "app.kubernetes.io/name";
/// `nexo.io/role`: `manager-state` on the state Secret.
pub const ROLE: &str = "nexo.io/role";
/// The value of [`ROLE`] on the state Secret.
pub const STATE_ROLE: &str = "manager-state";

/// The Secrets of the shipped bundle (`manifests/`, the chart's defaults):
/// the connect token and the command keys.
pub const DEFAULT_SECRETS: [&str; 2] = ["nexo-connect-token", "nexo-command-keys"];

/// The Manager's own objects (docs/protocol.md, "Ownership"): never the target
/// of a deploy, rollout or uninstall, whatever their labels say. Known by
/// name in the Manager's namespace (its state Secret, its Deployment, its
/// Lease, and what its own pod template names: Secrets and ConfigMaps it
/// mounts or reads, its ServiceAccount), and anywhere by the label
/// `app.kubernetes.io/name=nexo-manager` or `nexo.io/role`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnObjects {
    namespace: String,
    /// (kind, name) in `namespace`.
    named: Vec<(String, String)>,
}

impl OwnObjects {
    /// The objects named by the configuration, in `namespace`.
    pub fn new(namespace: &str, state_secret: &str, self_deployment: &str, lease: &str) -> Self {
        let mut own = OwnObjects {
            namespace: namespace.to_owned(),
            named: Vec::new(),
        };
        own.add("Secret", state_secret);
        own.add("Deployment", self_deployment);
        own.add("Lease", lease);
        // The names the shipped bundle gives the token and key Secrets:
        // known even when the Manager does not run from its Deployment.
        for name in DEFAULT_SECRETS {
            own.add("Secret", name);
        }
        own
    }

    /// Adds one object of the Manager's namespace.
    pub fn add(&mut self, kind: &str, name: &str) {
        if name.is_empty() || self.named.iter().any(|(k, n)| k == kind && n == name) {
            return;
        }
        self.named.push((kind.to_owned(), name.to_owned()));
    }

    /// Adds what the Manager's own Deployment (`deployment`, as read)
    /// names in its pod template: the Secrets and ConfigMaps of its
    /// volumes (projected ones included), `env` and `envFrom`, and its
    /// ServiceAccount.
    pub fn add_pod_template(&mut self, deployment: &Value) {
        let pod = &deployment["spec"]["template"]["spec"];
        let sa = pod["serviceAccountName"]
            .as_str()
            .or_else(|| pod["serviceAccount"].as_str())
            .unwrap_or("default");
        self.add("ServiceAccount", sa);
        let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
        for volume in list(&pod["volumes"]) {
            self.add_source(&volume);
            for source in list(&volume["projected"]["sources"]) {
                self.add_source(&source);
            }
        }
        for field in ["initContainers", "containers"] {
            for c in list(&pod[field]) {
                for e in list(&c["env"]) {
                    let from = &e["valueFrom"];
                    if let Some(n) = from["secretKeyRef"]["name"].as_str() {
                        self.add("Secret", n);
                    }
                    if let Some(n) = from["configMapKeyRef"]["name"].as_str() {
                        self.add("ConfigMap", n);
                    }
                }
                for e in list(&c["envFrom"]) {
                    if let Some(n) = e["secretRef"]["name"].as_str() {
                        self.add("Secret", n);
                    }
                    if let Some(n) = e["configMapRef"]["name"].as_str() {
                        self.add("ConfigMap", n);
                    }
                }
            }
        }
    }

    fn add_source(&mut self, source: &Value) {
        if let Some(n) = source["secret"]["secretName"]
            .as_str()
            .or_else(|| source["secret"]["name"].as_str())
        {
            self.add("Secret", n);
        }
        if let Some(n) = source["configMap"]["name"].as_str() {
            self.add("ConfigMap", n);
        }
    }

    /// Whether `kind` `namespace/name` is one of the Manager's own objects
    /// by name. Roles and RoleBindings of its namespace are all its own.
    pub fn named(&self, kind: &str, namespace: &str, name: &str) -> bool {
        namespace == self.namespace
            && (matches!(kind, "Role" | "RoleBinding")
                || self.named.iter().any(|(k, n)| k == kind && n == name))
    }

    /// Whether an object (as read, or as a manifest) is labelled as one
    /// of the Manager's own.
    pub fn labelled(object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        labels[NAME] == MANAGER || !labels[ROLE].is_null()
    }

    /// The refusal of an own object, if `object` (read, when it exists) or
    /// its name makes `kind` `namespace/name` one:
    /// `refused: the Manager's own object <kind>/<name>`.
    pub fn refusal(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        object: Option<&Value>,
    ) -> Option<Refusal> {
        (self.named(kind, namespace, name) || object.is_some_and(Self::labelled)).then(|| {
            Refusal::OwnObject {
                kind: kind.to_owned(),
                name: name.to_owned(),
                named_by: None,
            }
        })
    }
}

/// What an existing object is, as far as this Manager is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Both ownership labels, with this environment, and a valid proof
    /// that this Manager wrote it ([`integrity`]).
    Owned,
    /// This environment's labels without a valid proof: written by 0.4,
    /// or labelled by someone else. Adopted only through the gate
    /// `NEXO_ADOPT_UNPROVEN` (SECURITY.md, "Integrity the namespace cannot
    /// forge").
    Unproven,
    /// Managed by a Nexo Manager of another environment: never touched.
    OtherEnvironment(String),
    /// Written by the 0.2.0 line: `part-of=nexo`, no owner id. Adopted only
    /// through the migration gate.
    Legacy,
    /// Anything else: never touched.
    Unrelated,
}

/// The one verdict on an object's ownership: this environment's labels
/// and a proof made with its key, or the gate that adopts unproven
/// objects. Plain values: the planners, the drift check and the inventory
/// ask it.
#[derive(Debug, Clone, Copy)]
pub struct Verifier<'a> {
    /// This environment.
    pub environment_id: &'a str,
    /// The key the proofs are made with (the state's `integrityKey`).
    pub key: &'a Key,
    /// `NEXO_ADOPT_UNPROVEN`: an object with this environment's labels but
    /// no valid proof may be written (and so given its proof).
    pub adopt_unproven: bool,
}

impl Verifier<'_> {
    /// What `object` (of `kind`, as read) is: [`classify`] by its labels,
    /// and [`Ownership::Unproven`] when its labels say this environment but
    /// its proof does not.
    pub fn classify(&self, kind: &str, object: &Value) -> Ownership {
        match classify(object, self.environment_id) {
            Ownership::Owned if self.proven(kind, object) => Ownership::Owned,
            Ownership::Owned => Ownership::Unproven,
            other => other,
        }
    }

    /// Whether `object`'s proof is this Manager's for its kind, namespace,
    /// name, uid and `nexo.io/deployment` label.
    pub fn proven(&self, kind: &str, object: &Value) -> bool {
        let meta = &object["metadata"];
        let (Some(namespace), Some(name), Some(uid), Some(deployment)) = (
            meta["namespace"].as_str(),
            meta["name"].as_str(),
            meta["uid"].as_str(),
            meta["labels"][DEPLOYMENT].as_str(),
        ) else {
            return false;
        };
        let proof = meta["annotations"][integrity::ANNOTATION]
            .as_str()
            .unwrap_or_default();
        self.verify(kind, namespace, name, uid, deployment, proof)
    }

    /// Whether `proof` is this Manager's for that object.
    pub fn verify(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        deployment: &str,
        proof: &str,
    ) -> bool {
        let claim = self.claim(kind, namespace, name, uid, deployment);
        self.key.verify_object(&claim, proof)
    }

    /// The proof of an object written for `deployment`, once its uid is
    /// known.
    pub fn proof(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        deployment: &str,
    ) -> String {
        let claim = self.claim(kind, namespace, name, uid, deployment);
        self.key.object_proof(&claim)
    }

    fn claim<'c>(
        &self,
        kind: &'c str,
        namespace: &'c str,
        name: &'c str,
        uid: &'c str,
        deployment: &'c str,
    ) -> ObjectClaim<'c>
    where
        Self: 'c,
    {
        ObjectClaim {
            environment_id: self.environment_id,
            deployment,
            kind,
            namespace,
            name,
            uid,
        }
    }

    /// Why an existing object (of `kind`) may not be written;
    /// `legacy_gate`: both halves of the legacy migration gate are open.
    pub fn refusal_reason(
        &self,
        kind: &str,
        existing: &Value,
        legacy_gate: bool,
    ) -> Option<String> {
        self.refusal_of(&self.classify(kind, existing), legacy_gate)
    }

    /// [`Verifier::refusal_reason`] of an object classified already.
    fn refusal_of(&self, ownership: &Ownership, legacy_gate: bool) -> Option<String> {
        match ownership {
            Ownership::Owned => None,
            Ownership::Unproven if self.adopt_unproven => None,
            Ownership::Unproven => Some(UNPROVEN.into()),
            Ownership::Legacy if legacy_gate => None,
            Ownership::Legacy => Some(
                "is a legacy (0.2.0) object; adopting it needs both NEXO_ALLOW_LEGACY_ADOPTION=true and migration.adoptLegacy: true".into(),
            ),
            Ownership::OtherEnvironment(other) => Some(format!("belongs to environment {other}")),
            Ownership::Unrelated => Some("exists and is not managed by nexo-manager".into()),
        }
    }

    /// Why `existing`, classified already as `ownership` (its proof checked
    /// once), may not be written by a command of `deployment`:
    /// [`Verifier::refusal_reason`], then the per-deployment rule
    /// ([`other_deployment`]) for objects this environment owns.
    fn refusal_for_classified(
        &self,
        ownership: &Ownership,
        existing: &Value,
        deployment: &str,
        legacy_gate: bool,
    ) -> Option<String> {
        self.refusal_of(ownership, legacy_gate)
            .or_else(|| match ownership {
                Ownership::Owned | Ownership::Unproven => other_deployment(existing, deployment),
                _ => None,
            })
    }
}

/// The one verdict on an existing object a command of one deployment
/// meets: whether it is the Manager's own, the deployment's, or neither
/// and why. Computed once per object read ([`Judge::verdict`]); every
/// class's planner decides from it.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// One of the Manager's own objects (by name, or by its labels as
    /// read): never a command's target.
    ManagersOwn(Refusal),
    /// Not the deployment's: why, the text after the object's name.
    NotTheDeployments(String),
    /// The deployment's; `adopt`: a legacy object, through the open gate.
    Deployments { adopt: bool },
}

/// What judges an object: the Manager's own objects and the verifier of
/// labels and proofs.
#[derive(Debug, Clone, Copy)]
pub struct Judge<'a> {
    pub own: &'a OwnObjects,
    pub verifier: Verifier<'a>,
}

/// What a command of one deployment asks of an object it read.
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    /// The object, as the command names it.
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The command's deployment.
    pub deployment: &'a str,
    /// Both halves of the legacy migration gate are open.
    pub legacy_gate: bool,
    /// It must carry `nexo.io/deployment=<deployment>` (an object a pod
    /// template names outside the deploy).
    pub labelled: bool,
}

impl Judge<'_> {
    /// The verdict on `object` (as read): the Manager's own first, then
    /// its labels and proof ([`Verifier::classify`], its proof checked
    /// once), the legacy gate, the per-deployment rule
    /// ([`other_deployment`]) and the label rule when asked.
    pub fn verdict(&self, q: &Question<'_>, object: &Value) -> Verdict {
        if let Some(refusal) = self.own.refusal(q.kind, q.namespace, q.name, Some(object)) {
            return Verdict::ManagersOwn(refusal);
        }
        let ownership = self.verifier.classify(q.kind, object);
        if let Some(why) =
            self.verifier
                .refusal_for_classified(&ownership, object, q.deployment, q.legacy_gate)
        {
            return Verdict::NotTheDeployments(why);
        }
        if q.labelled && object["metadata"]["labels"][DEPLOYMENT] != q.deployment {
            return Verdict::NotTheDeployments(format!(
                "is not labelled {DEPLOYMENT}={}",
                q.deployment
            ));
        }
        Verdict::Deployments {
            adopt: ownership == Ownership::Legacy,
        }
    }
}

/// The reason an unproven object is refused.
pub const UNPROVEN: &str = "carries this environment's labels but no valid proof that this Manager wrote it (written by 0.4, or labelled by someone else); adopting it needs NEXO_ADOPT_UNPROVEN=true";

/// The ownerReference of `object` with `controller: true`, if any: what
/// controls it.
pub fn controller(object: &Value) -> Option<&Value> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
}

/// Why an owned object belongs to another deployment than `deployment`
/// (docs/protocol.md, "Ownership"): its `nexo.io/deployment` label names another
/// one, or it has a controller ownerReference to something other than that
/// deployment's NexoProxy. An object without the label (or a controller) is
/// not claimed by any other deployment.
pub fn other_deployment(existing: &Value, deployment: &str) -> Option<String> {
    let meta = &existing["metadata"];
    if let Some(label) = meta["labels"][DEPLOYMENT].as_str()
        && label != deployment
    {
        return Some(format!(
            "belongs to deployment {}",
            crate::text::escape(label)
        ));
    }
    let controller = controller(existing)?;
    let ours = controller["kind"] == "NexoProxy"
        && controller["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("nexo.io/"))
        && controller["name"] == deployment;
    (!ours).then(|| {
        format!(
            "is controlled by {} {}",
            crate::text::escape(controller["kind"].as_str().unwrap_or("?")),
            crate::text::escape(controller["name"].as_str().unwrap_or("?"))
        )
    })
}

/// Classifies an object (JSON, as custom resources are read) from its
/// `metadata.labels` alone: what the labels claim. Only
/// [`Verifier::classify`] says what the Manager owns.
pub fn classify(object: &Value, environment_id: &str) -> Ownership {
    let labels = &object["metadata"]["labels"];
    classify_by(|k| labels.get(k).and_then(Value::as_str), environment_id)
}

/// Classifies from a label lookup (`label(key)` gives the value of that
/// label): the one rule behind [`classify`] and the
/// inventory's projections.
pub fn classify_by<'a>(label: impl Fn(&str) -> Option<&'a str>, environment_id: &str) -> Ownership {
    match (label(MANAGED_BY), label(OWNER_ID)) {
        (Some(MANAGER), Some(owner)) if owner == environment_id => Ownership::Owned,
        (_, Some(owner)) => Ownership::OtherEnvironment(owner.to_owned()),
        (_, None) if label(PART_OF) == Some("nexo") => Ownership::Legacy,
        _ => Ownership::Unrelated,
    }
}

/// The label selector of this environment's owned objects.
pub fn owned_selector(environment_id: &str) -> String {
    format!("{MANAGED_BY}={MANAGER},{OWNER_ID}={environment_id}")
}

#[cfg(test)]
#[path = "ownership_tests.rs"]
mod tests;
