//! The legacy Deployment's policy (protocol.md, "Command trust"): an
//! allowlist of fields, walked from the object's root, so that a field
//! Kubernetes added since (an image volume, a CSI inline volume, a
//! projected token for any audience) is refused by its path instead of
//! slipping through. Values are judged by type, not spelling: `80`, `80.0`
//! and `"80"` are the same port, a boolean is only `true` or `false`, and
//! `null` is the field left out. The Pod Security Standards' `baseline`
//! and `restricted` profiles are checked on the way, and the Secrets and
//! ConfigMaps the pod names are collected for the reference rule.

use serde_json::{Map, Value};

use super::{PodSecurity, Reference, Violation, clip};

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

/// The Deployment's own fields.
const DEPLOYMENT: &[&str] = &["apiVersion", "kind", "metadata", "spec"];
const OBJECT_META: &[&str] = &["name", "namespace", "labels", "annotations"];
const DEPLOYMENT_SPEC: &[&str] = &[
    "replicas",
    "selector",
    "template",
    "strategy",
    "minReadySeconds",
    "revisionHistoryLimit",
    "progressDeadlineSeconds",
    "paused",
];
const TEMPLATE: &[&str] = &["metadata", "spec"];
const TEMPLATE_META: &[&str] = &["labels", "annotations"];
/// The pod: what the Proxy needs, and the scheduling fields.
const POD_SPEC: &[&str] = &[
    "containers",
    "initContainers",
    "volumes",
    "affinity",
    "tolerations",
    "nodeSelector",
    "topologySpreadConstraints",
    "priorityClassName",
    "terminationGracePeriodSeconds",
    "securityContext",
    "automountServiceAccountToken",
    "serviceAccountName",
    "serviceAccount",
    "restartPolicy",
    "dnsPolicy",
    "schedulerName",
];
const POD_SECURITY_CONTEXT: &[&str] = &[
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "fsGroup",
    "fsGroupChangePolicy",
    "supplementalGroups",
    "seccompProfile",
    "seLinuxOptions",
    "appArmorProfile",
    "sysctls",
];
const CONTAINER: &[&str] = &[
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "ports",
    "resources",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "volumeMounts",
    "securityContext",
    "terminationMessagePath",
    "terminationMessagePolicy",
];
const CONTAINER_SECURITY_CONTEXT: &[&str] = &[
    "allowPrivilegeEscalation",
    "capabilities",
    "privileged",
    "readOnlyRootFilesystem",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "seccompProfile",
    "seLinuxOptions",
    "appArmorProfile",
    "procMount",
];
const PORT: &[&str] = &["name", "containerPort", "protocol", "hostPort", "hostIP"];
const ENV: &[&str] = &["name", "value", "valueFrom"];
const ENV_SOURCE: &[&str] = &[
    "secretKeyRef",
    "configMapKeyRef",
    "fieldRef",
    "resourceFieldRef",
];
const KEY_REF: &[&str] = &["name", "key", "optional"];
const ENV_FROM: &[&str] = &["prefix", "secretRef", "configMapRef"];
const NAME_REF: &[&str] = &["name", "optional"];
const PROBE: &[&str] = &[
    "exec",
    "httpGet",
    "tcpSocket",
    "grpc",
    "initialDelaySeconds",
    "periodSeconds",
    "timeoutSeconds",
    "successThreshold",
    "failureThreshold",
    "terminationGracePeriodSeconds",
];
const HANDLER: &[&str] = &["exec", "httpGet", "tcpSocket", "sleep"];
/// No `host`: the kubelet would send the request anywhere the CP says.
const HTTP_GET: &[&str] = &["path", "port", "scheme", "httpHeaders"];
const TCP_SOCKET: &[&str] = &["port"];
const VOLUME_MOUNT: &[&str] = &["name", "mountPath", "readOnly", "subPath", "subPathExpr"];
/// Volumes of these kinds only: the configuration the Proxy reads.
const VOLUME_KINDS: &[&str] = &["configMap", "secret", "emptyDir", "downwardAPI"];

/// Where a value is: the manifest, and the path inside it.
#[derive(Clone)]
struct At<'a> {
    manifest: &'a str,
    path: String,
}

impl<'a> At<'a> {
    fn field(&self, name: &str) -> At<'a> {
        At {
            manifest: self.manifest,
            path: if self.path.is_empty() {
                name.to_owned()
            } else {
                format!("{}.{name}", self.path)
            },
        }
    }

    fn index(&self, i: usize) -> At<'a> {
        At {
            manifest: self.manifest,
            path: format!("{}[{i}]", self.path),
        }
    }

    /// A broken rule here.
    fn violation(&self, what: impl std::fmt::Display) -> Violation {
        Violation(format!("{} {}: {what}", self.manifest, self.path))
    }

    /// A field outside the allowlist.
    fn not_allowed(&self) -> Violation {
        Violation(format!(
            "field not allowed: {} ({})",
            clip(&self.path),
            self.manifest
        ))
    }
}

/// The object's fields, each in `allowed`; `null` counts as absent.
fn fields<'v>(
    v: &'v Value,
    at: &At<'_>,
    allowed: &[&str],
) -> Result<Option<&'v Map<String, Value>>, Violation> {
    match v {
        Value::Null => Ok(None),
        Value::Object(map) => {
            for (key, value) in map {
                if !value.is_null() && !allowed.contains(&key.as_str()) {
                    return Err(at.field(key).not_allowed());
                }
            }
            Ok(Some(map))
        }
        _ => Err(at.violation("not an object")),
    }
}

/// A list (`null`: empty).
fn list<'v>(v: &'v Value, at: &At<'_>) -> Result<&'v [Value], Violation> {
    match v {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        _ => Err(at.violation("not a list")),
    }
}

/// A boolean: only `true` or `false` (`null`: absent).
fn boolean(v: &Value, at: &At<'_>) -> Result<Option<bool>, Violation> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        _ => Err(at.violation("not a boolean")),
    }
}

/// An integer, however it is spelled: `80`, `80.0`, `"80"` (`null`: absent).
pub(super) fn integer(v: &Value, at_path: &str) -> Result<Option<i64>, String> {
    let n = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|f| (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)),
        _ => None,
    };
    n.map(Some)
        .ok_or_else(|| format!("{at_path}: not an integer"))
}

fn int(v: &Value, at: &At<'_>) -> Result<Option<i64>, Violation> {
    integer(v, "").map_err(|_| at.violation("not an integer"))
}

/// A string (`null`: absent).
fn string<'v>(v: &'v Value, at: &At<'_>) -> Result<Option<&'v str>, Violation> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(at.violation("not a string")),
    }
}

/// A value that may be anything of the right JSON type, not looked into
/// further (scheduling, quantities, labels).
fn of_type(v: &Value, at: &At<'_>, object: bool) -> Result<(), Violation> {
    match (v, object) {
        (Value::Null, _) | (Value::Object(_), true) | (Value::Array(_), false) => Ok(()),
        (_, true) => Err(at.violation("not an object")),
        (_, false) => Err(at.violation("not a list")),
    }
}

/// A map of strings (labels, annotations); `null` values are absent.
fn string_map<'v>(v: &'v Value, at: &At<'_>) -> Result<Vec<(&'v str, &'v str)>, Violation> {
    let map = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Object(m) => m,
        _ => return Err(at.violation("not an object")),
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, value) in map {
        match value {
            Value::String(s) => out.push((k.as_str(), s.as_str())),
            Value::Null => {}
            _ => return Err(at.field(k).violation("not a string")),
        }
    }
    Ok(out)
}

/// What a legacy Deployment is judged against.
pub(super) struct PodRules<'a> {
    pub profile: PodSecurity,
    pub repositories: &'a [&'a str],
}

/// What the walk found that the caller checks further: the pod
/// template's labels (a Service must select them), the Deployment's
/// selector, and the Secrets and ConfigMaps the pod names.
#[derive(Debug, Default)]
pub(super) struct Found {
    pub template_labels: Vec<(String, String)>,
    pub selector: Vec<(String, String)>,
    pub references: Vec<Reference>,
}

/// Walks a legacy Deployment (`object`, described as `manifest` in
/// messages) against the allowlist and `rules`.
pub(super) fn deployment(
    object: &Value,
    manifest: &str,
    rules: &PodRules<'_>,
) -> Result<Found, Violation> {
    let root = At {
        manifest,
        path: String::new(),
    };
    let mut found = Found::default();
    if fields(object, &root, DEPLOYMENT)?.is_none() {
        return Err(root.violation("not an object"));
    }
    let top = object;
    let meta = root.field("metadata");
    fields(&top["metadata"], &meta, OBJECT_META)?;
    let spec_at = root.field("spec");
    if fields(&top["spec"], &spec_at, DEPLOYMENT_SPEC)?.is_none() {
        return Err(spec_at.violation("missing"));
    }
    let spec = &top["spec"];
    for f in [
        "replicas",
        "minReadySeconds",
        "revisionHistoryLimit",
        "progressDeadlineSeconds",
    ] {
        if int(&spec[f], &spec_at.field(f))?.is_some_and(|n| n < 0) {
            return Err(spec_at.field(f).violation("negative"));
        }
    }
    boolean(&spec["paused"], &spec_at.field("paused"))?;
    of_type(&spec["strategy"], &spec_at.field("strategy"), true)?;
    let selector_at = spec_at.field("selector");
    if fields(&spec["selector"], &selector_at, &["matchLabels"])?.is_some() {
        let selector = &spec["selector"];
        found.selector = string_map(&selector["matchLabels"], &selector_at.field("matchLabels"))?
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    }
    let template_at = spec_at.field("template");
    if fields(&spec["template"], &template_at, TEMPLATE)?.is_none() {
        return Err(template_at.violation("missing"));
    }
    let template = &spec["template"];
    let tmeta_at = template_at.field("metadata");
    if fields(&template["metadata"], &tmeta_at, TEMPLATE_META)?.is_some() {
        let tmeta = &template["metadata"];
        found.template_labels = string_map(&tmeta["labels"], &tmeta_at.field("labels"))?
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let annotations = string_map(&tmeta["annotations"], &tmeta_at.field("annotations"))?;
        apparmor_annotations(&tmeta_at.field("annotations"), &annotations)?;
    }
    pod(
        &template["spec"],
        &template_at.field("spec"),
        rules,
        &mut found,
    )?;
    Ok(found)
}

fn pod(v: &Value, at: &At<'_>, rules: &PodRules<'_>, found: &mut Found) -> Result<(), Violation> {
    if fields(v, at, POD_SPEC)?.is_none() {
        return Err(at.violation("missing"));
    }
    let spec = v;
    for f in ["affinity", "nodeSelector"] {
        of_type(&spec[f], &at.field(f), true)?;
    }
    for f in ["tolerations", "topologySpreadConstraints"] {
        of_type(&spec[f], &at.field(f), false)?;
    }
    string(&spec["priorityClassName"], &at.field("priorityClassName"))?;
    if int(
        &spec["terminationGracePeriodSeconds"],
        &at.field("terminationGracePeriodSeconds"),
    )?
    .is_some_and(|n| n < 0)
    {
        return Err(at
            .field("terminationGracePeriodSeconds")
            .violation("negative"));
    }
    // A fixed value, or what the API server would default it to.
    for (f, allowed) in [
        ("restartPolicy", &["Always"][..]),
        ("dnsPolicy", &["ClusterFirst", "Default"][..]),
        ("schedulerName", &["default-scheduler"][..]),
    ] {
        if let Some(value) = string(&spec[f], &at.field(f))?
            && !allowed.contains(&value)
        {
            return Err(at.field(f).violation(format!(
                "{} is not allowed (allowed: {})",
                clip(value),
                allowed.join(", ")
            )));
        }
    }
    // A deployed pod runs as `default`, never as the Manager or another account.
    for f in ["serviceAccountName", "serviceAccount"] {
        if let Some(sa) = string(&spec[f], &at.field(f))?
            && !sa.is_empty()
            && sa != "default"
        {
            return Err(at.field(f).violation(format!(
                "{}: a deployed pod runs as the default ServiceAccount",
                clip(sa)
            )));
        }
    }
    if boolean(
        &spec["automountServiceAccountToken"],
        &at.field("automountServiceAccountToken"),
    )? == Some(true)
    {
        return Err(at
            .field("automountServiceAccountToken")
            .violation("only false is allowed"));
    }
    let sc_at = at.field("securityContext");
    let pod_sc = fields(&spec["securityContext"], &sc_at, POD_SECURITY_CONTEXT)?;
    let empty = Value::Null;
    let pod_sc_value = &spec["securityContext"];
    if pod_sc.is_some() {
        context(pod_sc_value, &sc_at)?;
        for (i, s) in list(&pod_sc_value["sysctls"], &sc_at.field("sysctls"))?
            .iter()
            .enumerate()
        {
            let s_at = sc_at.field("sysctls").index(i);
            fields(s, &s_at, &["name", "value"])?;
            let name = string(&s["name"], &s_at.field("name"))?.unwrap_or("");
            if !SAFE_SYSCTLS.contains(&name) {
                return Err(s_at.violation(format!("{} is not a safe sysctl", clip(name))));
            }
        }
        for g in ["fsGroup", "runAsGroup", "supplementalGroups"] {
            if g == "supplementalGroups" {
                for (i, n) in list(&pod_sc_value[g], &sc_at.field(g))?.iter().enumerate() {
                    int(n, &sc_at.field(g).index(i))?;
                }
            } else {
                int(&pod_sc_value[g], &sc_at.field(g))?;
            }
        }
        string(
            &pod_sc_value["fsGroupChangePolicy"],
            &sc_at.field("fsGroupChangePolicy"),
        )?;
    }
    let volumes_at = at.field("volumes");
    let mut volume_names = Vec::new();
    for (i, v) in list(&spec["volumes"], &volumes_at)?.iter().enumerate() {
        let name = volume(v, &volumes_at.index(i), found)?;
        volume_names.push(name);
    }
    for field in ["initContainers", "containers"] {
        let c_at = at.field(field);
        let containers = list(&spec[field], &c_at)?;
        if field == "containers" && containers.is_empty() {
            return Err(c_at.violation("no container"));
        }
        for (i, c) in containers.iter().enumerate() {
            container(
                c,
                &c_at.index(i),
                rules,
                if pod_sc.is_some() {
                    pod_sc_value
                } else {
                    &empty
                },
                found,
            )?;
        }
    }
    Ok(())
}

/// One volume: a name and exactly one allowed kind. Its name.
fn volume(v: &Value, at: &At<'_>, found: &mut Found) -> Result<String, Violation> {
    let mut allowed = vec!["name"];
    allowed.extend_from_slice(VOLUME_KINDS);
    if fields(v, at, &allowed)?.is_none() {
        return Err(at.violation("not an object"));
    }
    let name = string(&v["name"], &at.field("name"))?
        .unwrap_or_default()
        .to_owned();
    let kinds: Vec<&str> = VOLUME_KINDS
        .iter()
        .copied()
        .filter(|k| !v[*k].is_null())
        .collect();
    let [kind] = kinds[..] else {
        return Err(
            at.violation("a volume has exactly one of configMap, secret, emptyDir, downwardAPI")
        );
    };
    let k_at = at.field(kind);
    let source = &v[kind];
    match kind {
        "configMap" => {
            fields(source, &k_at, &["name", "items", "defaultMode", "optional"])?;
            key_paths(&source["items"], &k_at.field("items"))?;
            if let Some(n) = string(&source["name"], &k_at.field("name"))? {
                found
                    .references
                    .push(Reference::config_map(n, &k_at.field("name").path));
            }
        }
        "secret" => {
            fields(
                source,
                &k_at,
                &["secretName", "items", "defaultMode", "optional"],
            )?;
            key_paths(&source["items"], &k_at.field("items"))?;
            if let Some(n) = string(&source["secretName"], &k_at.field("secretName"))? {
                found
                    .references
                    .push(Reference::secret(n, &k_at.field("secretName").path));
            }
        }
        "emptyDir" => {
            fields(source, &k_at, &["medium", "sizeLimit"])?;
        }
        _ => {
            fields(source, &k_at, &["items", "defaultMode"])?;
            for (i, item) in list(&source["items"], &k_at.field("items"))?
                .iter()
                .enumerate()
            {
                let i_at = k_at.field("items").index(i);
                fields(
                    item,
                    &i_at,
                    &["path", "fieldRef", "resourceFieldRef", "mode"],
                )?;
                fields(
                    &item["fieldRef"],
                    &i_at.field("fieldRef"),
                    &["fieldPath", "apiVersion"],
                )?;
                fields(
                    &item["resourceFieldRef"],
                    &i_at.field("resourceFieldRef"),
                    &["containerName", "resource", "divisor"],
                )?;
            }
        }
    }
    Ok(name)
}

/// The `items` of a configMap or secret volume.
fn key_paths(v: &Value, at: &At<'_>) -> Result<(), Violation> {
    for (i, item) in list(v, at)?.iter().enumerate() {
        fields(item, &at.index(i), &["key", "path", "mode"])?;
    }
    Ok(())
}

fn container(
    c: &Value,
    at: &At<'_>,
    rules: &PodRules<'_>,
    pod_sc: &Value,
    found: &mut Found,
) -> Result<(), Violation> {
    if fields(c, at, CONTAINER)?.is_none() {
        return Err(at.violation("not an object"));
    }
    image(&c["image"], &at.field("image"), rules.repositories)?;
    for f in ["command", "args"] {
        for (i, s) in list(&c[f], &at.field(f))?.iter().enumerate() {
            string(s, &at.field(f).index(i))?;
        }
    }
    ports(&c["ports"], &at.field("ports"))?;
    for (i, e) in list(&c["env"], &at.field("env"))?.iter().enumerate() {
        let e_at = at.field("env").index(i);
        fields(e, &e_at, ENV)?;
        let from_at = e_at.field("valueFrom");
        let from = &e["valueFrom"];
        if fields(from, &from_at, ENV_SOURCE)?.is_some() {
            references(
                from,
                &from_at,
                ["secretKeyRef", "configMapKeyRef"],
                KEY_REF,
                found,
            )?;
            fields(
                &from["fieldRef"],
                &from_at.field("fieldRef"),
                &["fieldPath", "apiVersion"],
            )?;
            fields(
                &from["resourceFieldRef"],
                &from_at.field("resourceFieldRef"),
                &["containerName", "resource", "divisor"],
            )?;
        }
    }
    for (i, e) in list(&c["envFrom"], &at.field("envFrom"))?
        .iter()
        .enumerate()
    {
        let e_at = at.field("envFrom").index(i);
        fields(e, &e_at, ENV_FROM)?;
        references(e, &e_at, ["secretRef", "configMapRef"], NAME_REF, found)?;
    }
    fields(
        &c["resources"],
        &at.field("resources"),
        &["limits", "requests"],
    )?;
    for f in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let p_at = at.field(f);
        if fields(&c[f], &p_at, PROBE)?.is_some() {
            handler(&c[f], &p_at)?;
        }
    }
    let l_at = at.field("lifecycle");
    if fields(&c["lifecycle"], &l_at, &["postStart", "preStop"])?.is_some() {
        for f in ["postStart", "preStop"] {
            if fields(&c["lifecycle"][f], &l_at.field(f), HANDLER)?.is_some() {
                handler(&c["lifecycle"][f], &l_at.field(f))?;
            }
        }
    }
    for (i, m) in list(&c["volumeMounts"], &at.field("volumeMounts"))?
        .iter()
        .enumerate()
    {
        fields(m, &at.field("volumeMounts").index(i), VOLUME_MOUNT)?;
    }
    let sc_at = at.field("securityContext");
    if fields(&c["securityContext"], &sc_at, CONTAINER_SECURITY_CONTEXT)?.is_some() {
        context(&c["securityContext"], &sc_at)?;
    }
    container_baseline(&c["securityContext"], &sc_at)?;
    if rules.profile == PodSecurity::Restricted {
        container_restricted(&c["securityContext"], &sc_at, pod_sc)?;
    }
    Ok(())
}

/// A container's ports: no `hostPort` (0 is the field left out), no `hostIP`.
fn ports(v: &Value, at: &At<'_>) -> Result<(), Violation> {
    for (i, p) in list(v, at)?.iter().enumerate() {
        let p_at = at.index(i);
        fields(p, &p_at, PORT)?;
        int(&p["containerPort"], &p_at.field("containerPort"))?;
        if int(&p["hostPort"], &p_at.field("hostPort"))?.is_some_and(|n| n != 0) {
            return Err(p_at.field("hostPort").violation("hostPort is not allowed"));
        }
        if string(&p["hostIP"], &p_at.field("hostIP"))?.is_some_and(|s| !s.is_empty()) {
            return Err(p_at.field("hostIP").violation("hostIP is not allowed"));
        }
    }
    Ok(())
}

/// The Secret and the ConfigMap an `env` source or an `envFrom` entry
/// names (`fields`: their Secret and ConfigMap field names), collected.
fn references(
    source: &Value,
    at: &At<'_>,
    fields_of: [&str; 2],
    allowed: &[&str],
    found: &mut Found,
) -> Result<(), Violation> {
    for (f, secret) in [(fields_of[0], true), (fields_of[1], false)] {
        let r_at = at.field(f);
        if fields(&source[f], &r_at, allowed)?.is_some()
            && let Some(n) = string(&source[f]["name"], &r_at.field("name"))?
        {
            let path = &r_at.field("name").path;
            found.references.push(match secret {
                true => Reference::secret(n, path),
                false => Reference::config_map(n, path),
            });
        }
    }
    Ok(())
}

/// A probe's or a lifecycle hook's action.
fn handler(v: &Value, at: &At<'_>) -> Result<(), Violation> {
    fields(&v["exec"], &at.field("exec"), &["command"])?;
    let h_at = at.field("httpGet");
    fields(&v["httpGet"], &h_at, HTTP_GET)?;
    for (i, h) in list(&v["httpGet"]["httpHeaders"], &h_at.field("httpHeaders"))?
        .iter()
        .enumerate()
    {
        fields(h, &h_at.field("httpHeaders").index(i), &["name", "value"])?;
    }
    fields(&v["tcpSocket"], &at.field("tcpSocket"), TCP_SOCKET)?;
    fields(&v["grpc"], &at.field("grpc"), &["port", "service"])?;
    fields(&v["sleep"], &at.field("sleep"), &["seconds"])?;
    for f in [
        "initialDelaySeconds",
        "periodSeconds",
        "timeoutSeconds",
        "successThreshold",
        "failureThreshold",
        "terminationGracePeriodSeconds",
    ] {
        if !v[f].is_null() {
            int(&v[f], &at.field(f))?;
        }
    }
    Ok(())
}

fn image(v: &Value, at: &At<'_>, repositories: &[&str]) -> Result<(), Violation> {
    let Some(text) = string(v, at)? else {
        return Err(at.violation("the image is missing"));
    };
    match crate::image::ImageRef::parse(text) {
        Ok(r) if repositories.contains(&r.repository.as_str()) => Ok(()),
        Ok(r) => Err(at.violation(format!(
            "image repository {} is not allowed (allowed: {}; NEXO_ALLOWED_IMAGE_REPOSITORIES adds others)",
            clip(&r.repository),
            repositories.join(", ")
        ))),
        Err(e) => Err(at.violation(e)),
    }
}

/// The security annotations of older Kubernetes releases: AppArmor
/// (`container.apparmor.security.beta.kubernetes.io/…`) and seccomp
/// (`seccomp.security.alpha.kubernetes.io/pod`,
/// `container.seccomp.security.alpha.kubernetes.io/…`): only the runtime's
/// default or a profile on the node.
fn apparmor_annotations(at: &At<'_>, annotations: &[(&str, &str)]) -> Result<(), Violation> {
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
fn context(sc: &Value, at: &At<'_>) -> Result<(), Violation> {
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

fn container_baseline(sc: &Value, at: &At<'_>) -> Result<(), Violation> {
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
fn container_restricted(sc: &Value, at: &At<'_>, pod: &Value) -> Result<(), Violation> {
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
