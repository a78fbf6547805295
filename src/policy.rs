//! The content policy (protocol.md, "Command trust", capability
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

use crate::commands::{Deploy, Kind, Manifest};
use crate::image::ImageRef;

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

/// Capabilities a baseline container may add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The sysctls the baseline profile calls safe.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// The SELinux types a baseline pod may ask for.
const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The volume types a restricted pod may use.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

impl Policy {
    /// Checks every manifest of a deploy; the first broken rule.
    pub fn check_deploy(&self, d: &Deploy, proxy_image: &ImageRef) -> Result<(), Violation> {
        let repositories: Vec<&str> = std::iter::once(proxy_image.repository.as_str())
            .chain(self.image_repositories.iter().map(String::as_str))
            .collect();
        for m in &d.manifests {
            self.check_manifest(m, &repositories)?;
        }
        Ok(())
    }

    fn check_manifest(&self, m: &Manifest, repositories: &[&str]) -> Result<(), Violation> {
        let at = m.reference.to_string();
        let o = &m.object;
        match m.reference.kind {
            Kind::NexoProxy => match &o["spec"]["image"] {
                Value::Null => Ok(()),
                image => image_allowed(&format!("{at} spec.image"), image, repositories),
            },
            Kind::Deployment => {
                let pod = &o["spec"]["template"]["spec"];
                pod_images(&at, pod, repositories)?;
                service_account(&at, pod)?;
                apparmor_annotations(&at, &o["spec"]["template"]["metadata"]["annotations"])?;
                pod_security(&at, pod, self.pod_security)
            }
            Kind::Secret => match o["type"].as_str() {
                None | Some("Opaque" | "kubernetes.io/tls") => Ok(()),
                Some(other) => Err(violation(
                    &at,
                    format!(
                        "type {:?}: only Opaque and kubernetes.io/tls Secrets may be deployed",
                        clip(other)
                    ),
                )),
            },
            Kind::Service => self.service(&at, &o["spec"]),
            Kind::NexoPipeline | Kind::ConfigMap => Ok(()),
        }
    }

    fn service(&self, at: &str, spec: &Value) -> Result<(), Violation> {
        if spec["externalIPs"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            return Err(violation(
                at,
                "spec.externalIPs: a Service may not claim external IPs",
            ));
        }
        match spec["type"].as_str() {
            None | Some("ClusterIP") => Ok(()),
            Some("NodePort" | "LoadBalancer") if self.external_services => Ok(()),
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
    crate::logging::escape(&crate::commands::clip(s, 120)).into_owned()
}

/// Every container list of a pod spec, with its field name.
fn containers(pod: &Value) -> impl Iterator<Item = (&'static str, &Value)> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |field| {
            pod[field]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |c| (field, c))
        })
}

/// Where a container is, for a message.
fn container_at(at: &str, field: &str, c: &Value) -> String {
    format!("{at} {field} {}", clip(c["name"].as_str().unwrap_or("?")))
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

fn pod_images(at: &str, pod: &Value, repositories: &[&str]) -> Result<(), Violation> {
    for (field, c) in containers(pod) {
        image_allowed(&container_at(at, field, c), &c["image"], repositories)?;
    }
    Ok(())
}

/// A legacy pod runs as `default`: never as the Manager or another account.
fn service_account(at: &str, pod: &Value) -> Result<(), Violation> {
    for field in ["serviceAccountName", "serviceAccount"] {
        match pod[field].as_str() {
            None | Some("" | "default") => {}
            Some(other) => {
                return Err(violation(
                    at,
                    format!(
                        "spec.template.spec.{field} {}: a deployed pod runs as the default ServiceAccount",
                        clip(other)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The AppArmor profiles the pod template's annotations may ask for
/// (`container.apparmor.security.beta.kubernetes.io/<container>`):
/// `runtime/default` or `localhost/…`.
fn apparmor_annotations(at: &str, annotations: &Value) -> Result<(), Violation> {
    const PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
    for (key, value) in annotations.as_object().into_iter().flatten() {
        if !key.starts_with(PREFIX) {
            continue;
        }
        let value = value.as_str().unwrap_or("?");
        if value != "runtime/default" && !value.starts_with("localhost/") {
            return Err(violation(
                &format!("{at} spec.template.metadata.annotations"),
                format!("{} {} is not allowed", clip(key), clip(value)),
            ));
        }
    }
    Ok(())
}

fn is_true(v: &Value) -> bool {
    v.as_bool() == Some(true)
}

/// Checks a pod spec against a Pod Security Standards profile.
pub fn pod_security(at: &str, pod: &Value, profile: PodSecurity) -> Result<(), Violation> {
    let spec = |what: &str| format!("{at} spec.template.spec.{what}");
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if is_true(&pod[field]) {
            return Err(violation(&spec(field), "host namespaces are not allowed"));
        }
    }
    let pod_sc = &pod["securityContext"];
    baseline_context(&spec("securityContext"), pod_sc)?;
    for sysctl in pod_sc["sysctls"].as_array().into_iter().flatten() {
        let name = sysctl["name"].as_str().unwrap_or("?");
        if !SAFE_SYSCTLS.contains(&name) {
            return Err(violation(
                &spec("securityContext.sysctls"),
                format!("{} is not a safe sysctl", clip(name)),
            ));
        }
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        volume_allowed(&spec("volumes"), volume, profile)?;
    }
    for (field, c) in containers(pod) {
        let at = container_at(at, field, c);
        container_baseline(&at, c)?;
        if profile == PodSecurity::Restricted {
            container_restricted(&at, c, pod_sc)?;
        }
    }
    Ok(())
}

fn volume_allowed(at: &str, volume: &Value, profile: PodSecurity) -> Result<(), Violation> {
    let name = clip(volume["name"].as_str().unwrap_or("?"));
    if volume.get("hostPath").is_some() {
        return Err(violation(
            at,
            format!("{name}: hostPath volumes are not allowed"),
        ));
    }
    if profile == PodSecurity::Restricted {
        let kind = volume
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys())
            .find(|k| *k != "name");
        if let Some(kind) = kind
            && !RESTRICTED_VOLUMES.contains(&kind.as_str())
        {
            return Err(violation(
                at,
                format!(
                    "{name}: {} volumes are not allowed by the restricted profile",
                    clip(kind)
                ),
            ));
        }
    }
    Ok(())
}

/// The baseline rules a pod or container `securityContext` shares.
fn baseline_context(at: &str, sc: &Value) -> Result<(), Violation> {
    if is_true(&sc["windowsOptions"]["hostProcess"]) {
        return Err(violation(at, "windowsOptions.hostProcess is not allowed"));
    }
    let selinux = &sc["seLinuxOptions"];
    if !selinux["user"].is_null() || !selinux["role"].is_null() {
        return Err(violation(at, "seLinuxOptions.user and role may not be set"));
    }
    if let Some(t) = selinux["type"].as_str()
        && !SELINUX_TYPES.contains(&t)
    {
        return Err(violation(
            at,
            format!("seLinuxOptions.type {} is not allowed", clip(t)),
        ));
    }
    if sc["seccompProfile"]["type"] == "Unconfined" {
        return Err(violation(
            at,
            "seccompProfile.type Unconfined is not allowed",
        ));
    }
    match sc["appArmorProfile"]["type"].as_str() {
        None | Some("RuntimeDefault" | "Localhost") => Ok(()),
        Some(other) => Err(violation(
            at,
            format!("appArmorProfile.type {} is not allowed", clip(other)),
        )),
    }
}

fn container_baseline(at: &str, c: &Value) -> Result<(), Violation> {
    let sc = &c["securityContext"];
    let here = format!("{at} securityContext");
    baseline_context(&here, sc)?;
    if is_true(&sc["privileged"]) {
        return Err(violation(&here, "privileged containers are not allowed"));
    }
    if sc["procMount"].as_str().is_some_and(|p| p != "Default") {
        return Err(violation(
            &here,
            "procMount other than Default is not allowed",
        ));
    }
    for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
        let cap = cap.as_str().unwrap_or("?");
        if !BASELINE_CAPABILITIES.contains(&cap) {
            return Err(violation(
                &here,
                format!("capability {} may not be added", clip(cap)),
            ));
        }
    }
    for port in c["ports"].as_array().into_iter().flatten() {
        if port["hostPort"].as_u64().is_some_and(|p| p != 0) {
            return Err(violation(&format!("{at} ports"), "hostPort is not allowed"));
        }
    }
    Ok(())
}

/// The restricted rules of one container; `pod` is the pod's
/// `securityContext`, whose settings a container inherits.
fn container_restricted(at: &str, c: &Value, pod: &Value) -> Result<(), Violation> {
    let sc = &c["securityContext"];
    let here = format!("{at} securityContext");
    if sc["allowPrivilegeEscalation"] != false {
        return Err(violation(
            &here,
            "allowPrivilegeEscalation must be false (restricted)",
        ));
    }
    let non_root = match &sc["runAsNonRoot"] {
        Value::Bool(b) => *b,
        _ => is_true(&pod["runAsNonRoot"]),
    };
    if !non_root {
        return Err(violation(
            &here,
            "runAsNonRoot must be true, here or for the pod (restricted)",
        ));
    }
    if sc["runAsUser"] == 0 || (sc["runAsUser"].is_null() && pod["runAsUser"] == 0) {
        return Err(violation(&here, "runAsUser 0 is not allowed (restricted)"));
    }
    let seccomp = match &sc["seccompProfile"]["type"] {
        Value::Null => &pod["seccompProfile"]["type"],
        t => t,
    };
    if !matches!(seccomp.as_str(), Some("RuntimeDefault" | "Localhost")) {
        return Err(violation(
            &here,
            "seccompProfile.type must be RuntimeDefault or Localhost, here or for the pod (restricted)",
        ));
    }
    let caps = &sc["capabilities"];
    if !caps["drop"]
        .as_array()
        .is_some_and(|d| d.iter().any(|c| c == "ALL"))
    {
        return Err(violation(
            &here,
            "capabilities.drop must include ALL (restricted)",
        ));
    }
    if caps["add"]
        .as_array()
        .is_some_and(|a| a.iter().any(|c| c != "NET_BIND_SERVICE"))
    {
        return Err(violation(
            &here,
            "only NET_BIND_SERVICE may be added (restricted)",
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
