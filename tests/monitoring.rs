//! The monitoring that ships with the chart (agent.md, "Operating it"),
//! checked by Prometheus' own promtool (testbed.sh builds it) and the real
//! API server: the PrometheusRule's alerts and the Grafana dashboard's
//! queries parse; a real scrape of the Manager passes `promtool check
//! metrics` and holds every series they read; and `promtool test rules`
//! evaluates the alerts over a real Manager's scrapes, taken a second apart
//! and read as a minute apart: none fires at rest, and the ones that should
//! fire do when a command is refused, when its Control Plane answers 503,
//! and when it stops.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nexo_cpsim::{Endpoint, Fault, FaultAction};
use serde_json::{Value, json};
use support::chart::{CHART, helm, install_monitoring_crds, objects, template};
use support::commands::command;
use support::fixture::Fixture;
use support::{Testbed, run_ok_with_input as ok, run_with_input as run, testbed};

/// The alerts of the chart's PrometheusRule, in its order.
const ALERTS: [&str; 10] = [
    "NexoManagerDown",
    "NexoManagerNotLeading",
    "NexoManagerHeartbeatsFailing",
    "NexoManagerCommandsFailing",
    "NexoManagerCommandsRefused",
    "NexoManagerCommandSignatureRefused",
    "NexoManagerStateWritesFailing",
    "NexoManagerDriftFound",
    "NexoManagerRolloutFailed",
    "NexoManagerRollbackFailed",
];

/// values.yaml's `metrics.prometheusRule.runbookURL`.
const RUNBOOKS: &str = "https://nexo.example/nexo-manager/blob/main/charts/nexo-manager/README.md";

/// A folder of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("monitoring-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn promtool(tb: &Testbed) -> Command {
    assert!(
        tb.promtool.is_file(),
        "promtool is missing at {} (tests/testbed/testbed.sh build builds it)",
        tb.promtool.display()
    );
    Command::new(&tb.promtool)
}

/// The PrometheusRule the chart renders into `namespace` with `args`.
fn prometheus_rule(tb: &Testbed, namespace: &str, args: &[&str]) -> Value {
    let mut all = vec!["--set", "connectToken.existingSecret=t"];
    all.extend_from_slice(&["--set", "metrics.prometheusRule.enabled=true"]);
    all.extend_from_slice(args);
    let rendered = objects(tb, &template(tb, "mon", namespace, &all));
    rendered
        .get(&format!("PrometheusRule {namespace}/mon-nexo-manager"))
        .unwrap_or_else(|| panic!("no PrometheusRule rendered: {:?}", rendered.keys()))
        .clone()
}

/// Its rules.
fn rules(rule: &Value) -> Vec<Value> {
    let groups = rule["spec"]["groups"].as_array().expect("spec.groups");
    assert_eq!(groups.len(), 1, "one group: {groups:?}");
    groups[0]["rules"].as_array().expect("rules").clone()
}

/// `promtool check rules` of `spec` (a rules file: `groups`), written into
/// `dir`; its output.
fn check_rules(tb: &Testbed, dir: &Path, name: &str, spec: &Value) -> String {
    let file = dir.join(name);
    std::fs::write(&file, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    ok(promtool(tb).args(["check", "rules"]).arg(&file), None)
}

/// The metric names a PromQL expression reads: the Manager's and the
/// process's (the other words are functions, labels and durations).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if word(bytes[i]) && (i == 0 || !word(bytes[i - 1])) {
            let end = (i..bytes.len())
                .find(|&j| !word(bytes[j]))
                .unwrap_or(bytes.len());
            let w = &expr[i..end];
            // A label value ("…") is not a name.
            let quoted = i > 0 && bytes[i - 1] == b'"';
            if !quoted && (w.starts_with("nexo_manager_") || w.starts_with("process_")) {
                names.insert(w.to_owned());
            }
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// The series names a scrape holds (a histogram's `_bucket`, `_sum` and
/// `_count` included).
fn scraped_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// The samples of a scrape: the series as written and its value.
fn samples(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("series value");
            (series.to_owned(), value.to_owned())
        })
        .collect()
}

/// `series` with the labels Prometheus gives a scrape of the Manager's
/// pod added (the ServiceMonitor's and PodMonitor's `namespace` and
/// `container` among them).
fn with_target(series: &str, namespace: &str) -> String {
    let target = format!(
        "namespace=\"{namespace}\",container=\"manager\",pod=\"mon-nexo-manager-0\",job=\"mon-nexo-manager\""
    );
    match series.split_once('{') {
        Some((name, labels)) => format!("{name}{{{},{labels}", target),
        None => format!("{series}{{{target}}}"),
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_the_api_server_and_each_has_a_runbook() {
    let tb = testbed();
    install_monitoring_crds(tb);
    let ns = tb.namespace("mon-rules");
    let dir = scratch("rules");
    let rule = prometheus_rule(tb, &ns.name, &[]);
    let list = rules(&rule);
    let names: Vec<&str> = list.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert_eq!(names, ALERTS, "the alerts");
    let out = check_rules(tb, &dir, "rules.json", &rule["spec"]);
    assert!(
        out.contains("SUCCESS: 10 rules found"),
        "promtool check rules:\n{out}"
    );
    let readme = std::fs::read_to_string(Path::new(CHART).join("README.md")).unwrap();
    let selector = format!("namespace=\"{}\",container=\"manager\"", ns.name);
    for r in &list {
        let name = r["alert"].as_str().unwrap();
        let expr = r["expr"].as_str().unwrap();
        assert!(
            expr.contains(&selector),
            "{name} selects the release's Manager ({selector}): {expr}"
        );
        let severity = r["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}'s severity: {r}"
        );
        for a in ["summary", "description"] {
            assert!(
                r["annotations"][a].as_str().is_some_and(|t| t.len() > 20),
                "{name} has a {a}: {r}"
            );
        }
        assert_eq!(
            r["annotations"]["runbook_url"],
            format!("{RUNBOOKS}#{}", name.to_lowercase()),
            "{name}'s runbook"
        );
        assert!(
            readme.contains(&format!("\n### {name}\n")),
            "the chart README has no runbook section `### {name}`"
        );
    }
    // The API server takes it (the CRD's schema), as the chart renders it.
    let applied = ok(
        tb.kubectl_cmd()
            .args(["apply", "--server-side", "-o", "json", "-f", "-"])
            .args(["--namespace", &ns.name]),
        Some(rule.to_string().as_bytes()),
    );
    let stored: Value = serde_json::from_str(&applied).unwrap();
    assert_eq!(stored["spec"], rule["spec"], "stored as rendered");

    // What a user may change: the selector, labels on every alert, alerts
    // left out.
    let tuned = prometheus_rule(
        tb,
        &ns.name,
        &[
            "--set",
            "metrics.prometheusRule.selector=job=\"nexo\\,prod\"",
            "--set",
            "metrics.prometheusRule.additionalAlertLabels.team=databases",
            "--set",
            "metrics.prometheusRule.disabled={NexoManagerDriftFound}",
            "--set",
            "metrics.prometheusRule.runbookURL=",
        ],
    );
    let tuned_rules = rules(&tuned);
    let names: Vec<&str> = tuned_rules
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 9, "one left out: {names:?}");
    assert!(!names.contains(&"NexoManagerDriftFound"), "{names:?}");
    for r in &tuned_rules {
        let expr = r["expr"].as_str().unwrap();
        assert!(
            expr.contains("{job=\"nexo,prod\"") && !expr.contains("container="),
            "the selector given: {expr}"
        );
        assert_eq!(r["labels"]["team"], "databases", "{r}");
        assert!(r["annotations"].get("runbook_url").is_none(), "{r}");
    }
    let out = check_rules(tb, &dir, "tuned.json", &tuned["spec"]);
    assert!(out.contains("SUCCESS: 9 rules found"), "{out}");

    // What the schema refuses, naming the value.
    for (bad, names) in [
        ("metrics.prometheusRule.selector=up", "selector"),
        (
            "metrics.prometheusRule.disabled={NexoManagerBored}",
            "disabled",
        ),
        (
            "metrics.prometheusRule.runbookURL=file:///etc",
            "runbookURL",
        ),
    ] {
        let out = run(
            helm(tb)
                .args([
                    "template",
                    "mon",
                    CHART,
                    "--set",
                    "connectToken.existingSecret=t",
                ])
                .args(["--set", "metrics.prometheusRule.enabled=true", "--set", bad]),
            None,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(names),
            "{bad}: refused naming {names}:\n{err}"
        );
    }
}

#[test]
fn a_real_scrape_passes_promtool_and_holds_what_the_alerts_and_the_dashboard_read() {
    let f = Fixture::new("mon-scrape");
    let tb = f.tb;
    let mut m = f.spawn_with_probes(&[]);
    let probe = m.probe_addr();
    m.wait_until(Duration::from_secs(60), "a heartbeat accepted", || {
        support::metric(probe, "nexo_manager_heartbeats_total{outcome=\"ok\"}") >= Some(1.0)
    });
    let text = m.metrics();
    let checked = run(
        promtool(tb).args(["check", "metrics"]),
        Some(text.as_bytes()),
    );
    m.check(
        checked.status.success(),
        &format!(
            "promtool check metrics ({}):\n{}{}\nthe scrape:\n{text}",
            checked.status,
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        ),
    );
    let scraped = scraped_names(&text);

    // Every series an alert reads is in the scrape.
    install_monitoring_crds(tb);
    let rule = prometheus_rule(tb, &f.ns.name, &[]);
    for r in rules(&rule) {
        let expr = r["expr"].as_str().unwrap();
        let read = metric_names(expr);
        m.check(!read.is_empty(), &format!("{expr} reads a metric"));
        let missing: Vec<_> = read.difference(&scraped).collect();
        m.check(
            missing.is_empty(),
            &format!(
                "{} reads {missing:?}, not in the scrape:\n{text}",
                r["alert"]
            ),
        );
    }

    // The dashboard: every query parses (promtool, as recording rules) and
    // reads series the scrape holds.
    let file = std::fs::read_to_string(Path::new(CHART).join("files/dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&file).expect("files/dashboard.json is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let ids: BTreeSet<i64> = panels.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    m.check(ids.len() == panels.len(), "each panel has an id of its own");
    let mut records = Vec::new();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        m.check(
            !targets.is_empty(),
            &format!("panel {} has a query", p["title"]),
        );
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let read = metric_names(expr);
            let missing: Vec<_> = read.difference(&scraped).collect();
            m.check(
                !read.is_empty() && missing.is_empty(),
                &format!(
                    "panel {} reads {read:?}; not scraped: {missing:?}",
                    p["title"]
                ),
            );
            let concrete = expr
                .replace("$namespace", &f.ns.name)
                .replace("$__rate_interval", "1m");
            records.push(json!({
                "record": format!("dashboard:panel_{}_{}", p["id"], t["refId"].as_str().unwrap()),
                "expr": concrete,
            }));
        }
    }
    let n = records.len();
    let dir = scratch("dashboard");
    let spec = json!({"groups": [{"name": "dashboard", "rules": records}]});
    let out = check_rules(tb, &dir, "dashboard.json", &spec);
    m.check(
        out.contains(&format!("SUCCESS: {n} rules found")),
        &format!("promtool check rules of the dashboard's queries:\n{out}"),
    );
    let variable = &dashboard["templating"]["list"][1];
    m.check(
        variable["name"] == "namespace"
            && variable["definition"] == "label_values(nexo_manager_build_info, namespace)",
        &format!("the namespace variable: {variable}"),
    );

    // The chart's ConfigMap holds the file as it is.
    let rendered = objects(
        tb,
        &template(
            tb,
            "mon",
            &f.ns.name,
            &[
                "--set",
                "connectToken.existingSecret=t",
                "--set",
                "metrics.grafanaDashboard.enabled=true",
            ],
        ),
    );
    let cm = &rendered[&format!("ConfigMap {}/mon-nexo-manager-dashboard", f.ns.name)];
    m.check(
        cm["metadata"]["labels"]["grafana_dashboard"] == "1",
        &format!("the sidecar's label: {cm}"),
    );
    let held: Value = serde_json::from_str(cm["data"]["nexo-manager.json"].as_str().unwrap())
        .expect("the ConfigMap holds JSON");
    m.check(
        held == dashboard,
        "the ConfigMap holds files/dashboard.json",
    );
}

/// Scrapes of one Manager, a second apart (a minute apart in promtool's
/// time): `None` where the scrape had nothing (the Manager gone).
struct Scrapes {
    taken: Vec<Option<String>>,
    next: Instant,
}

impl Scrapes {
    fn new() -> Scrapes {
        Scrapes {
            taken: Vec::new(),
            next: Instant::now(),
        }
    }

    /// Waits for the next second and scrapes `probe` (`None`: no answer).
    fn tick(&mut self, probe: Option<std::net::SocketAddr>) -> Option<&str> {
        self.next += Duration::from_secs(1);
        std::thread::sleep(self.next.saturating_duration_since(Instant::now()));
        let text = probe.map(|addr| {
            let (status, text) = support::http_get(addr, "/metrics");
            assert_eq!(status, 200, "/metrics: {text}");
            text
        });
        self.taken.push(text);
        self.taken.last().unwrap().as_deref()
    }

    /// The minute of the last scrape.
    fn now(&self) -> usize {
        self.taken.len() - 1
    }

    /// promtool's `input_series`: each series the scrapes held, with the
    /// target's labels, one value a minute (`_` where it was absent).
    fn input_series(&self, namespace: &str) -> Vec<Value> {
        let mut series: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (minute, text) in self.taken.iter().enumerate() {
            for (s, v) in samples(text.as_deref().unwrap_or("")) {
                let values = series.entry(with_target(&s, namespace)).or_default();
                values.resize(minute, "_".into());
                values.push(v);
            }
        }
        series
            .into_iter()
            .map(|(s, values)| json!({"series": s, "values": values.join(" ")}))
            .collect()
    }
}

/// One `alert_rule_test` per alert at `minute`: those in `firing` with
/// their labels and annotations, the others not firing.
fn expect_at(minute: usize, firing: &[(&str, Value, Value)]) -> Vec<Value> {
    ALERTS
        .iter()
        .map(|name| {
            let exp: Vec<Value> = firing
                .iter()
                .filter(|(n, _, _)| n == name)
                .map(|(_, labels, annotations)| {
                    json!({"exp_labels": labels, "exp_annotations": annotations})
                })
                .collect();
            json!({"eval_time": format!("{minute}m"), "alertname": name, "exp_alerts": exp})
        })
        .collect()
}

/// An alert's annotations as Prometheus fills them in: `summary` and
/// `description` as the alert's templates should read for the scrapes, or
/// the description of the rendered rule where it has no template.
fn annotations(rule: &[Value], name: &str, summary: &str, description: Option<&str>) -> Value {
    let r = rule.iter().find(|r| r["alert"] == name).unwrap();
    let written = r["annotations"]["description"].as_str().unwrap();
    assert!(
        description.is_some() || !written.contains("{{"),
        "{name}'s description is a template: give it as it should read"
    );
    json!({
        "summary": summary,
        "description": description.unwrap_or(written),
        "runbook_url": format!("{RUNBOOKS}#{}", name.to_lowercase()),
    })
}

#[test]
fn alerts_fire_on_scrapes_of_a_manager_in_trouble_and_none_at_rest() {
    let f = Fixture::new("mon-alerts");
    let tb = f.tb;
    install_monitoring_crds(tb);
    let ns = f.ns.name.clone();
    let rule = prometheus_rule(tb, &ns, &[]);
    let list = rules(&rule);
    let mut m = f.spawn_with_probes(&[]);
    let probe = m.probe_addr();
    m.wait_until(Duration::from_secs(60), "two heartbeats accepted", || {
        support::metric(probe, "nexo_manager_heartbeats_total{outcome=\"ok\"}") >= Some(2.0)
    });
    let mut scrapes = Scrapes::new();
    // At rest: leading, heartbeats accepted, nothing refused.
    for _ in 0..8 {
        scrapes.tick(Some(probe));
    }
    let rest = scrapes.now();
    // A command of a class this Manager does not know: refused.
    f.sim
        .enqueue_command(&f.env_id, command("mon-1", "reboot", json!({})));
    let refused = "nexo_manager_commands_refused_total{reason=\"unsupported_class\"}";
    let mut refused_at = None;
    for _ in 0..30 {
        let text = scrapes.tick(Some(probe)).unwrap();
        if support::sample(text, refused) >= Some(1.0) {
            refused_at = Some(scrapes.now());
            break;
        }
    }
    let Some(refused_at) = refused_at else {
        m.fail("the command of class reboot was not refused within 30 s")
    };
    // Its Control Plane down: every heartbeat answered 503, Retry-After 1 s.
    f.sim.inject(
        Fault::new(
            Endpoint::Heartbeat,
            FaultAction::Status {
                status: 503,
                code: "unavailable".into(),
                message: "maintenance".into(),
                retry_after: Some("1".into()),
            },
        )
        .times(100_000),
    );
    for _ in 0..24 {
        scrapes.tick(Some(probe));
    }
    let failing_until = scrapes.now();
    let last = scrapes.taken[failing_until].clone().unwrap();
    m.check(
        support::sample(&last, "nexo_manager_heartbeats_total{outcome=\"failed\"}") >= Some(15.0),
        &format!("heartbeats failed through the outage:\n{last}"),
    );
    // Then it stops: nothing to scrape.
    m.stop_expecting_exit_0();
    for _ in 0..2 {
        scrapes.tick(None);
    }

    let dir = scratch("alerts");
    std::fs::write(
        dir.join("rules.json"),
        serde_json::to_vec_pretty(&rule["spec"]).unwrap(),
    )
    .unwrap();
    let labels = |severity: &str, extra: &[(&str, &str)]| {
        let mut l = json!({"namespace": ns, "severity": severity});
        for (k, v) in extra {
            l[*k] = json!(v);
        }
        l
    };
    let mut tests = Vec::new();
    tests.extend(expect_at(rest, &[]));
    tests.extend(expect_at(
        refused_at,
        &[(
            "NexoManagerCommandsRefused",
            labels("warning", &[("reason", "unsupported_class")]),
            annotations(
                &list,
                "NexoManagerCommandsRefused",
                &format!("Commands were refused in {ns} (unsupported_class)."),
                Some(
                    "The Manager refused commands before they ran, for unsupported_class: the \
                     Control Plane asked for something this cluster does not allow (ownership, \
                     policy, a downgrade) or sent what this version cannot read.",
                ),
            ),
        )],
    ));
    tests.extend(expect_at(
        failing_until,
        &[(
            "NexoManagerHeartbeatsFailing",
            labels("warning", &[]),
            annotations(
                &list,
                "NexoManagerHeartbeatsFailing",
                &format!("Every heartbeat of the Nexo Manager in {ns} fails."),
                None,
            ),
        )],
    ));
    // Five minutes without a sample make it absent, five more `for`.
    tests.extend(expect_at(
        failing_until + 12,
        &[(
            "NexoManagerDown",
            labels("critical", &[("container", "manager")]),
            annotations(
                &list,
                "NexoManagerDown",
                "No Nexo Manager has been scraped for 5 minutes.",
                None,
            ),
        )],
    ));
    let unit = json!({
        "rule_files": ["rules.json"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": scrapes.input_series(&ns),
            "alert_rule_test": tests,
        }],
    });
    let file = dir.join("test.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&unit).unwrap()).unwrap();
    let out = run(promtool(tb).args(["test", "rules"]).arg(&file), None);
    m.check(
        out.status.success(),
        &format!(
            "promtool test rules {} (rest until minute {rest}, refused at {refused_at}, \
             503s until {failing_until}):\n{}{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    );
}
