//! The content policy (docs/protocol.md, "Command trust", capability
//! `command.policy.v1`): what a deploy or an upgrade may put in the
//! cluster, whatever the Control Plane says. Checked from plain values
//! during validation, before any read, dry run or write; a refusal names
//! the rule and where it was broken (`policy: …`).
//!
//! The Pod Security Standards' `baseline` and `restricted` profiles are
//! checked here, from the pod template, so that a namespace without Pod
//! Security admission labels is protected all the same.

use std::fmt;

use serde_json::Value;

mod pod;
mod pod_security;
mod walk;

use crate::image::ImageRef;
use crate::resource::{Kind, Manifest};

/// The Pod Security Standards profile a legacy pod template must meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodSecurity {
    /// No privileged containers, host namespaces, host ports, hostPath
    /// volumes, added capabilities beyond the baseline set, unsafe sysctls
    /// or procMount, and the like.
    #[default]
    Baseline,
    /// Baseline, plus: non-root, no privilege escalation, capabilities
    /// dropped, a seccomp profile, only the restricted volume types.
    Restricted,
}

/// The configured policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `NEXO_ALLOWED_IMAGE_REPOSITORIES`: repositories a deploy may use
    /// besides the Proxy image's. Default: none.
    pub image_repositories: Vec<String>,
    /// `NEXO_MANAGER_IMAGE_REPOSITORY`: a repository an upgrade may use
    /// besides the Manager's current one. Default: none.
    pub manager_repository: Option<String>,
    /// `NEXO_ALLOW_EXTERNAL_SERVICES`: `NodePort` and `LoadBalancer`
    /// Services allowed. Default: false.
    pub external_services: bool,
    /// `NEXO_POD_SECURITY`. Default: baseline.
    pub pod_security: PodSecurity,
}

/// A broken rule: what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy: {}", self.0)
    }
}

impl std::error::Error for Violation {}

fn violation(at: &str, what: impl fmt::Display) -> Violation {
    Violation(format!("{at}: {what}"))
}

/// A Secret or ConfigMap a pod template names (docs/protocol.md, "References
/// stay inside the deployment").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `Secret` or `ConfigMap`.
    pub kind: Kind,
    /// Its name, in the deployment's namespace.
    pub name: String,
    /// Where the pod template names it, for the refusal.
    pub at: String,
}

impl Reference {
    fn secret(name: &str, at: &str) -> Reference {
        Reference {
            kind: Kind::Secret,
            name: name.to_owned(),
            at: at.to_owned(),
        }
    }

    fn config_map(name: &str, at: &str) -> Reference {
        Reference {
            kind: Kind::ConfigMap,
            name: name.to_owned(),
            at: at.to_owned(),
        }
    }

    /// The refusal of a reference to an object that is not this
    /// deployment's (`why` says what it is).
    pub fn refused(&self, manifest: &str, why: &str) -> Violation {
        Violation(format!(
            "{manifest} {}: {} {} {why}; a pod may name only its deployment's own Secrets and ConfigMaps",
            self.at,
            self.kind,
            clip(&self.name)
        ))
    }
}

/// The Secrets, ConfigMaps and NexoProxies a NexoProxy (`spec.mongodb.secretRef`,
/// `spec.configMapRef`) or a NexoPipeline (`spec.references`) names.
pub fn custom_resource_references(object: &Value) -> Vec<(Kind, &str)> {
    let spec = &object["spec"];
    let mut out = Vec::new();
    match object["kind"].as_str() {
        Some("NexoProxy") => {
            if let Some(n) = spec["mongodb"]["secretRef"]["name"].as_str() {
                out.push((Kind::Secret, n));
            }
            if let Some(n) = spec["configMapRef"]["name"].as_str() {
                out.push((Kind::ConfigMap, n));
            }
        }
        Some("NexoPipeline") => {
            for r in spec["references"].as_array().into_iter().flatten() {
                let kind = match r["kind"].as_str() {
                    Some("Secret") => Kind::Secret,
                    Some("ConfigMap") => Kind::ConfigMap,
                    Some("NexoProxy") => Kind::NexoProxy,
                    _ => continue,
                };
                if let Some(n) = r["name"].as_str() {
                    out.push((kind, n));
                }
            }
        }
        _ => {}
    }
    out
}

/// The metadata a manifest may carry (the Manager adds its labels and,
/// for a NexoProxy's objects, the owner reference).
const MANIFEST_METADATA: &[&str] = &["name", "namespace", "labels", "annotations"];

/// The profile a namespace's `pod-security.kubernetes.io/enforce` label
/// asks for, when it is stricter than `baseline`.
pub fn namespace_profile(enforce: Option<&str>) -> PodSecurity {
    match enforce {
        Some("restricted") => PodSecurity::Restricted,
        _ => PodSecurity::Baseline,
    }
}

/// What a deploy's walk leaves to be checked against the cluster, by the
/// planner from what the executor reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterChecks {
    /// A legacy pod template was walked: its namespace's Pod Security
    /// level applies.
    pub pod_template: bool,
    /// Walked at `baseline`: the first `restricted` rule it breaks (the
    /// refusal in a namespace that enforces `restricted`).
    pub restricted: Option<Violation>,
    /// The references its pod template makes to Secrets and ConfigMaps
    /// not among the deploy's manifests, with the manifest making each:
    /// each must be an object of the same deployment.
    pub outside: Vec<(String, Reference)>,
}

impl Policy {
    /// Walks every manifest of a deploy once; the first broken rule, or
    /// what remains to be checked against the cluster.
    pub fn walk_deploy(
        &self,
        manifests: &[Manifest],
        proxy_image: &ImageRef,
    ) -> Result<ClusterChecks, Violation> {
        let repositories: Vec<&str> = std::iter::once(proxy_image.repository.as_str())
            .chain(self.image_repositories.iter().map(String::as_str))
            .collect();
        let rules = pod::PodRules {
            profile: self.pod_security,
            repositories: &repositories,
        };
        let mut checks = ClusterChecks::default();
        let mut workload: Option<pod::Found> = None;
        for m in manifests {
            let at = m.reference.to_string();
            let o = &m.object;
            for (key, value) in o["metadata"].as_object().into_iter().flatten() {
                if !value.is_null() && !MANIFEST_METADATA.contains(&key.as_str()) {
                    return Err(Violation(format!(
                        "field not allowed: metadata.{} ({at})",
                        clip(key)
                    )));
                }
            }
            match m.reference.kind {
                Kind::NexoProxy => match &o["spec"]["image"] {
                    Value::Null => {}
                    image => image_allowed(&format!("{at} spec.image"), image, &repositories)?,
                },
                Kind::Deployment => {
                    let mut found = pod::deployment(o, &at, &rules)?;
                    for r in &found.references {
                        let own = manifests
                            .iter()
                            .any(|m| m.reference.kind == r.kind && m.reference.name == r.name);
                        if !own {
                            checks.outside.push((at.clone(), r.clone()));
                        }
                    }
                    checks.pod_template = true;
                    checks.restricted = checks.restricted.take().or(found.restricted.take());
                    workload = Some(found);
                }
                Kind::Secret => match &o["type"] {
                    Value::Null => {}
                    Value::String(t) if t == "Opaque" || t == "kubernetes.io/tls" => {}
                    Value::String(other) => {
                        return Err(violation(
                            &at,
                            format!(
                                "type {:?}: only Opaque and kubernetes.io/tls Secrets may be deployed",
                                clip(other)
                            ),
                        ));
                    }
                    _ => return Err(violation(&at, "type is not a string")),
                },
                Kind::Service => self.service(&at, &o["spec"])?,
                Kind::NexoPipeline | Kind::ConfigMap => {}
            }
        }
        // A Service selects the deployment's own pods and nothing wider.
        for m in manifests
            .iter()
            .filter(|m| m.reference.kind == Kind::Service)
        {
            selector_inside(
                &m.reference.to_string(),
                &m.object["spec"],
                workload.as_ref(),
            )?;
        }
        Ok(checks)
    }

    fn service(&self, at: &str, spec: &Value) -> Result<(), Violation> {
        // Judged by type: anything but an empty list or nothing is a claim.
        let no_external_ips = match &spec["externalIPs"] {
            Value::Null => true,
            Value::Array(a) => a.is_empty(),
            _ => false,
        };
        if !no_external_ips {
            return Err(violation(
                at,
                "spec.externalIPs: a Service may not claim external IPs",
            ));
        }
        let kind = match &spec["type"] {
            Value::Null => None,
            Value::String(t) => Some(t.as_str()),
            _ => return Err(violation(at, "spec.type is not a string")),
        };
        let external_name = || {
            if spec["externalName"].is_null() {
                Ok(())
            } else {
                Err(violation(
                    at,
                    "spec.externalName: a Service may not point outside the cluster",
                ))
            }
        };
        match kind {
            None | Some("ClusterIP") => external_name(),
            Some("NodePort" | "LoadBalancer") if self.external_services => external_name(),
            Some(t @ ("NodePort" | "LoadBalancer")) => Err(violation(
                at,
                format!("spec.type {t} needs NEXO_ALLOW_EXTERNAL_SERVICES=true"),
            )),
            Some(other) => Err(violation(
                at,
                format!(
                    "spec.type {:?}: only ClusterIP Services (and NodePort or LoadBalancer when allowed) may be deployed",
                    clip(other)
                ),
            )),
        }
    }

    /// Checks an upgrade's image against the Manager's current one.
    pub fn check_upgrade(&self, image: &ImageRef, current: Option<&str>) -> Result<(), Violation> {
        let current = current.and_then(|c| ImageRef::parse(c).ok());
        let allowed: Vec<&str> = current
            .as_ref()
            .map(|c| c.repository.as_str())
            .into_iter()
            .chain(self.manager_repository.as_deref())
            .collect();
        if allowed.contains(&image.repository.as_str()) {
            return Ok(());
        }
        Err(violation(
            "managerImage",
            format!(
                "{} is not from the Manager's repository ({}); NEXO_MANAGER_IMAGE_REPOSITORY allows another",
                clip(&image.repository),
                if allowed.is_empty() {
                    "unknown".to_owned()
                } else {
                    allowed.join(", ")
                }
            ),
        ))
    }
}

fn clip(s: &str) -> String {
    crate::text::escape(&crate::text::clip(s, 120)).into_owned()
}

fn image_allowed(at: &str, image: &Value, repositories: &[&str]) -> Result<(), Violation> {
    let Some(text) = image.as_str() else {
        return Err(violation(at, "the image is not a string"));
    };
    match ImageRef::parse(text) {
        Ok(r) if repositories.contains(&r.repository.as_str()) => Ok(()),
        Ok(r) => Err(violation(
            at,
            format!(
                "image repository {} is not allowed (allowed: {}; NEXO_ALLOWED_IMAGE_REPOSITORIES adds others)",
                clip(&r.repository),
                repositories.join(", ")
            ),
        )),
        Err(e) => Err(violation(at, e)),
    }
}

/// A Service's selector: not empty, every pair among the legacy
/// Deployment's pod template labels, and at least its selector's pairs,
/// so that it selects this deployment's pods and no other workload's.
fn selector_inside(at: &str, spec: &Value, workload: Option<&pod::Found>) -> Result<(), Violation> {
    let here = format!("{at} spec.selector");
    let selector = match &spec["selector"] {
        Value::Object(m) if !m.is_empty() => m,
        Value::Null | Value::Object(_) => {
            return Err(violation(
                &here,
                "a Service must select the deployment's own pods (an empty selector selects none of them, or anything its endpoints say)",
            ));
        }
        _ => return Err(violation(&here, "not an object")),
    };
    let Some(w) = workload else {
        return Err(violation(
            &here,
            "a Service is deployed with the Deployment whose pods it selects",
        ));
    };
    for (k, v) in selector {
        let Some(v) = v.as_str() else {
            return Err(violation(&here, format!("{}: not a string", clip(k))));
        };
        if !w.template_labels.iter().any(|(tk, tv)| tk == k && tv == v) {
            return Err(violation(
                &here,
                format!(
                    "{}={} is not a label of the deployment's pod template: it would select other pods",
                    clip(k),
                    clip(v)
                ),
            ));
        }
    }
    for (k, v) in &w.selector {
        if selector.get(k).and_then(Value::as_str) != Some(v.as_str()) {
            return Err(violation(
                &here,
                format!(
                    "it lacks {}={} of the Deployment's selector: it would select other workloads' pods",
                    clip(k),
                    clip(v)
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
