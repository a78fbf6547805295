//! The Pod Security Standards' `baseline` and `restricted` profiles, as
//! the walk of a legacy Deployment checks them: security contexts, the
//! capabilities, sysctls and SELinux types a profile allows, and the
//! AppArmor and seccomp annotations of older releases.

use serde_json::Value;

use super::walk::{At, boolean, fields, int, list, string};
use super::{Violation, clip};

/// Capabilities a baseline container may add.
pub(super) const BASELINE_CAPABILITIES: &[&str] = &[
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
pub(super) const SAFE_SYSCTLS: &[&str] = &[
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
pub(super) const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The security annotations of older Kubernetes releases: AppArmor
/// (`container.apparmor.security.beta.kubernetes.io/…`) and seccomp
/// (`seccomp.security.alpha.kubernetes.io/pod`,
/// `container.seccomp.security.alpha.kubernetes.io/…`): only the runtime's
/// default or a profile on the node.
pub(super) fn apparmor_annotations(
    at: &At<'_>,
    annotations: &[(&str, &str)],
) -> Result<(), Violation> {
    const PREFIXES: &[&str] = &[
        "container.apparmor.security.beta.kubernetes.io/",
        "seccomp.security.alpha.kubernetes.io/",
        "container.seccomp.security.alpha.kubernetes.io/",
    ];
    for (key, value) in annotations {
        let confined = matches!(*value, "runtime/default" | "docker/default")
            || value.starts_with("localhost/");
        if PREFIXES.iter().any(|p| key.starts_with(p)) && !confined {
            return Err(at.violation(format!("{} {} is not allowed", clip(key), clip(value))));
        }
    }
    Ok(())
}

/// The baseline rules a pod or container `securityContext` shares.
pub(super) fn context(sc: &Value, at: &At<'_>) -> Result<(), Violation> {
    let se_at = at.field("seLinuxOptions");
    if fields(
        &sc["seLinuxOptions"],
        &se_at,
        &["type", "level", "user", "role"],
    )?
    .is_some()
    {
        let se = &sc["seLinuxOptions"];
        if !se["user"].is_null() || !se["role"].is_null() {
            return Err(se_at.violation("seLinuxOptions.user and role may not be set"));
        }
        if let Some(t) = string(&sc["seLinuxOptions"]["type"], &se_at.field("type"))?
            && !SELINUX_TYPES.contains(&t)
        {
            return Err(se_at.violation(format!("seLinuxOptions.type {} is not allowed", clip(t))));
        }
    }
    let sp_at = at.field("seccompProfile");
    fields(&sc["seccompProfile"], &sp_at, &["type", "localhostProfile"])?;
    if let Some(t) = string(&sc["seccompProfile"]["type"], &sp_at.field("type"))?
        && !matches!(t, "RuntimeDefault" | "Localhost")
    {
        return Err(sp_at.violation(format!("seccompProfile.type {} is not allowed", clip(t))));
    }
    let aa_at = at.field("appArmorProfile");
    fields(
        &sc["appArmorProfile"],
        &aa_at,
        &["type", "localhostProfile"],
    )?;
    if let Some(t) = string(&sc["appArmorProfile"]["type"], &aa_at.field("type"))?
        && !matches!(t, "RuntimeDefault" | "Localhost")
    {
        return Err(aa_at.violation(format!("appArmorProfile.type {} is not allowed", clip(t))));
    }
    boolean(&sc["runAsNonRoot"], &at.field("runAsNonRoot"))?;
    int(&sc["runAsUser"], &at.field("runAsUser"))?;
    Ok(())
}

pub(super) fn container_baseline(sc: &Value, at: &At<'_>) -> Result<(), Violation> {
    if boolean(&sc["privileged"], &at.field("privileged"))? == Some(true) {
        return Err(at.violation("privileged containers are not allowed"));
    }
    boolean(
        &sc["allowPrivilegeEscalation"],
        &at.field("allowPrivilegeEscalation"),
    )?;
    boolean(
        &sc["readOnlyRootFilesystem"],
        &at.field("readOnlyRootFilesystem"),
    )?;
    int(&sc["runAsGroup"], &at.field("runAsGroup"))?;
    if let Some(p) = string(&sc["procMount"], &at.field("procMount"))?
        && p != "Default"
    {
        return Err(at.violation("procMount other than Default is not allowed"));
    }
    let caps_at = at.field("capabilities");
    fields(&sc["capabilities"], &caps_at, &["add", "drop"])?;
    for (i, cap) in list(&sc["capabilities"]["add"], &caps_at.field("add"))?
        .iter()
        .enumerate()
    {
        let cap = string(cap, &caps_at.field("add").index(i))?.unwrap_or("");
        if !BASELINE_CAPABILITIES.contains(&cap) {
            return Err(caps_at.violation(format!("capability {} may not be added", clip(cap))));
        }
    }
    for (i, cap) in list(&sc["capabilities"]["drop"], &caps_at.field("drop"))?
        .iter()
        .enumerate()
    {
        string(cap, &caps_at.field("drop").index(i))?;
    }
    Ok(())
}

/// The restricted rules of one container; `pod` is the pod's
/// `securityContext`, whose settings a container inherits.
pub(super) fn container_restricted(sc: &Value, at: &At<'_>, pod: &Value) -> Result<(), Violation> {
    if boolean(&sc["allowPrivilegeEscalation"], at)? != Some(false) {
        return Err(at.violation("allowPrivilegeEscalation must be false (restricted)"));
    }
    let non_root = match boolean(&sc["runAsNonRoot"], at)? {
        Some(b) => b,
        None => boolean(&pod["runAsNonRoot"], at)? == Some(true),
    };
    if !non_root {
        return Err(at.violation("runAsNonRoot must be true, here or for the pod (restricted)"));
    }
    let user = match int(&sc["runAsUser"], at)? {
        Some(u) => Some(u),
        None => int(&pod["runAsUser"], at)?,
    };
    if user == Some(0) {
        return Err(at.violation("runAsUser 0 is not allowed (restricted)"));
    }
    let seccomp = match string(&sc["seccompProfile"]["type"], at)? {
        Some(t) => Some(t),
        None => string(&pod["seccompProfile"]["type"], at)?,
    };
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        return Err(at.violation(
            "seccompProfile.type must be RuntimeDefault or Localhost, here or for the pod (restricted)",
        ));
    }
    let caps = &sc["capabilities"];
    if !list(&caps["drop"], at)?.iter().any(|c| c == "ALL") {
        return Err(at.violation("capabilities.drop must include ALL (restricted)"));
    }
    if list(&caps["add"], at)?
        .iter()
        .any(|c| c != "NET_BIND_SERVICE")
    {
        return Err(at.violation("only NET_BIND_SERVICE may be added (restricted)"));
    }
    Ok(())
}
