//! The legacy Deployment's policy (docs/protocol.md, "Command trust"): an
//! allowlist of fields, walked from the object's root, so that a field
//! Kubernetes added since (an image volume, a CSI inline volume, a
//! projected token for any audience) is refused by its path instead of
//! slipping through. Values are judged by type, not spelling: `80`, `80.0`
//! and `"80"` are the same port, a boolean is only `true` or `false`, and
//! `null` is the field left out. The Pod Security Standards' `baseline`
//! and `restricted` profiles are checked on the way, and the Secrets and
//! ConfigMaps the pod names are collected for the reference rule.

use serde_json::Value;

use super::pod_security::{
    SAFE_SYSCTLS, apparmor_annotations, container_baseline, container_restricted, context,
};
use super::walk::{At, boolean, fields, int, list, of_type, string, string_map};
use super::{PodSecurity, Reference, Violation, clip};

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
    /// Walked at `baseline`: the first rule of the `restricted` profile the
    /// template breaks, which a namespace enforcing `restricted` refuses
    /// (the walk at `restricted` would have stopped there).
    pub restricted: Option<Violation>,
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
    match (
        rules.profile,
        container_restricted(&c["securityContext"], &sc_at, pod_sc),
    ) {
        (_, Ok(())) => {}
        (PodSecurity::Restricted, Err(v)) => return Err(v),
        (PodSecurity::Baseline, Err(v)) => {
            found.restricted.get_or_insert(v);
        }
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
