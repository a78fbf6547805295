//! The Manager as users run it: a pod from our image, started by a kubelet
//! from `manifests/`, probed, limited to 32 MiB, replaced by rolling updates;
//! and a second one installed with `helm install` from the chart.
//!
//! Run as `cargo test --test node` (tests/run.sh runs it with the rest). It
//! needs root, the static binary (`NEXO_STATIC_BINARY`, built by
//! tests/build-static.sh) and the node packages (see testbed.sh). Without
//! `NEXO_NODE_TESTBED_DIR` it sets everything up itself: builds the images
//! (tests/image/build-image.sh), starts a test bed with a node
//! (`testbed.sh start DIR --node`), imports the images and runs itself
//! again inside the test bed's network namespace, where the scenarios run
//! one after the other on the one cluster (a filter argument picks
//! scenarios by name). A scenario that fails prints the pods, events, the
//! Manager's logs and the simulator's request log.

mod support;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};
use support::{Testbed, run_ok, wait_for};

/// The heartbeat interval of the Manager under test (the shipped default is
/// 15 s; 3 s keeps failover and rollout scenarios short).
const INTERVAL: Duration = Duration::from_secs(3);
/// How long an upgrade's new pods may take to become Ready before the
/// Manager that applied it writes it back (`NEXO_SELF_UPGRADE_DEADLINE`).
const SELF_UPGRADE_DEADLINE: Duration = Duration::from_secs(30);
const NS: &str = "nexo-system";

fn main() -> ExitCode {
    match std::env::var_os("NEXO_NODE_TESTBED_DIR") {
        None => set_up_and_run_inside(),
        Some(dir) => run_scenarios(Path::new(&dir)),
    }
}

// ------------------------------------------------------------- outside --

/// Builds the images, starts the node test bed, imports the images, and runs
/// this binary again inside the test bed's network namespace.
fn set_up_and_run_inside() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = support::manager::static_binary();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("node-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let images_dir = tmp.join("images");
    let out = run_ok(
        Command::new("bash")
            .arg(root.join("tests/image/build-image.sh"))
            .arg(&binary)
            .arg(&images_dir)
            .arg(support::manager::arm64_binary()),
    );
    let refs = tmp.join("images.env");
    std::fs::write(&refs, &out).unwrap();
    eprintln!("node: images built:\n{out}");

    let dir = tmp.join("testbed");
    let script = support::script();
    let started = Instant::now();
    run_ok(
        Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .arg("--node")
            .arg(std::process::id().to_string()),
    );
    eprintln!("node: test bed with a node up in {:?}", started.elapsed());
    let stop = || {
        let _ = Command::new("bash")
            .arg(&script)
            .arg("stop")
            .arg(&dir)
            .status();
    };
    for archive in ["manager", "manager-b", "manager-crash", "proxy"] {
        run_ok(
            Command::new("bash")
                .arg(&script)
                .arg("import")
                .arg(&dir)
                .arg(images_dir.join(format!("{archive}.oci.tar"))),
        );
    }
    let netns = env_value(&dir, "NETNS");
    let status = Command::new("ip")
        .args(["netns", "exec", &netns])
        .arg(std::env::current_exe().unwrap())
        .args(std::env::args().skip(1))
        .env("NEXO_NODE_TESTBED_DIR", &dir)
        .env("NEXO_NODE_IMAGES", &refs)
        .status()
        .expect("run the node tests inside the test bed's network namespace");
    stop();
    if status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn env_value(dir: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(dir.join("env")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{} has no {key}", dir.join("env").display()))
        .to_owned()
}

// -------------------------------------------------------------- inside --

/// The images, as `REPO@DIGEST`.
struct Images {
    manager: String,
    manager_b: String,
    manager_crash: String,
    proxy: String,
}

/// Everything the scenarios share: the cluster with the Manager installed
/// from `manifests/`, and the CP simulator it talks to.
struct Bed {
    tb: Testbed,
    node_dir: PathBuf,
    images: Images,
    /// Where the image archives are.
    images_dir: PathBuf,
    sim: Arc<Simulator>,
    env_id: String,
    /// `kubectl get pods -w` of the Manager's namespace, for the record of
    /// every status a pod went through (exit codes of pods long gone).
    watch: Option<(Child, PathBuf)>,
}

type Scenario = fn(&Bed);

fn run_scenarios(dir: &Path) -> ExitCode {
    let tb = support::read_env(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let refs = std::fs::read_to_string(std::env::var("NEXO_NODE_IMAGES").unwrap()).unwrap();
    let image = |key: &str| {
        refs.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} image"))
            .to_owned()
    };
    let images = Images {
        manager: image("manager"),
        manager_b: image("manager_b"),
        manager_crash: image("manager_crash"),
        proxy: image("proxy"),
    };
    let node_ip: std::net::IpAddr = env_value(dir, "NODE_IP").parse().unwrap();
    let sim = Arc::new(
        Simulator::start_on(SimConfig::default(), SocketAddr::new(node_ip, 0))
            .expect("start the CP simulator on the node address"),
    );
    let env_id = "node-env".to_owned();
    let images_dir = PathBuf::from(std::env::var("NEXO_NODE_IMAGES").unwrap())
        .parent()
        .unwrap()
        .join("images");
    let mut bed = Bed {
        tb,
        node_dir: dir.to_owned(),
        images,
        images_dir,
        sim,
        env_id,
        watch: None,
    };
    let scenarios: &[(&str, Scenario)] = &[
        (
            "installed_from_the_manifests_the_pod_becomes_ready_and_heartbeats",
            installed,
        ),
        (
            "crd_and_legacy_deploys_and_the_legacy_pods_become_ready",
            deploys,
        ),
        (
            "self_upgrade_is_a_rolling_update_without_a_heartbeat_gap",
            self_upgrade,
        ),
        (
            "an_upgrade_to_a_crashing_image_is_rolled_back_by_the_old_pod_which_keeps_leading",
            crashing_upgrade,
        ),
        (
            "failover_to_the_second_replica_executes_no_command_twice",
            failover,
        ),
        (
            "greedy_answers_and_a_100_command_batch_cost_no_restart",
            greedy,
        ),
        ("footprint_as_the_kubelet_accounts_it", footprint),
        (
            "the_projected_service_account_token_is_rotated_under_it",
            token_rotation,
        ),
        (
            "installed_with_helm_the_pod_heartbeats_deploys_and_uninstalls",
            helm_install,
        ),
        (
            "rendered_with_helm_template_and_applied_the_gitops_tool_owns_the_version",
            gitops,
        ),
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let chosen: Vec<_> = scenarios
        .iter()
        .filter(|(name, _)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} node scenarios", chosen.len());
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in &chosen {
        install(&mut bed);
        let started = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&bed)));
        match result {
            Ok(()) => {
                passed += 1;
                println!("test node::{name} ... ok ({:.0?})", started.elapsed());
            }
            Err(_) => {
                failed += 1;
                println!("test node::{name} ... FAILED ({:.0?})", started.elapsed());
                report(&bed);
            }
        }
    }
    if let Some((mut child, _)) = bed.watch.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    bed.sim.shutdown();
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n"
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

impl Bed {
    /// Runs the test bed's kubectl with the admin kubeconfig.
    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .tb
            .kubectl_cmd()
            .args(args)
            .output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all)).unwrap()
    }

    /// The Manager's pods, oldest first.
    fn pods(&self) -> Vec<Value> {
        self.pods_of(NS, "app.kubernetes.io/name=nexo-manager")
    }

    /// The pods of `namespace` that `selector` selects, oldest first.
    fn pods_of(&self, namespace: &str, selector: &str) -> Vec<Value> {
        let list = self.json(&["-n", namespace, "get", "pods", "-l", selector]);
        let mut pods = list["items"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("kubectl gave no pod list: {list}"));
        pods.sort_by_key(|p| {
            p["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        });
        pods
    }

    fn lease_holder(&self) -> Option<String> {
        let lease = self
            .kubectl(&["-n", NS, "get", "lease", "nexo-manager", "-o", "json"])
            .ok()?;
        let lease: Value = serde_json::from_str(&lease).ok()?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
    }

    /// The lease holder once it is one of the running pods: right after a
    /// scale-down the lease may be released (a clean stop clears its holder)
    /// or still name the deleted pod until the survivor takes it.
    fn leader(&self) -> String {
        wait_for(
            Duration::from_secs(60),
            "a running pod holding the lease",
            || {
                let holder = self.lease_holder()?;
                let pod = self.pod_by_uid(&holder)?;
                (pod["status"]["phase"] == "Running"
                    && pod["metadata"]["deletionTimestamp"].is_null())
                .then_some(holder)
            },
        )
    }

    fn heartbeat_times(&self) -> Vec<SystemTime> {
        let mut t: Vec<SystemTime> = self
            .sim
            .briefs()
            .into_iter()
            .filter(|b| b.path.ends_with("/heartbeat") && b.status == 200)
            .map(|b| b.at)
            .collect();
        t.sort();
        t
    }

    fn ack(&self, id: &str) -> Option<Value> {
        self.sim.acks().into_iter().find(|a| a["commandId"] == id)
    }

    fn wait_ack(&self, id: &str, timeout: Duration) -> Value {
        wait_for(timeout, &format!("the ack of {id}"), || self.ack(id))
    }

    fn command(&self, id: &str, class: &str, payload: Value) {
        self.sim.enqueue_command(
            &self.env_id,
            json!({"id": id, "class": class, "issuedAt": "2026-12-03T00:00:00Z", "requires": [], "payload": payload}),
        );
    }

    /// The pod with `uid`, if it still exists.
    fn pod_by_uid(&self, uid: &str) -> Option<Value> {
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["uid"] == uid)
    }

    /// Every status the watch saw for the pod named `name`.
    fn watched(&self, name: &str) -> Vec<Value> {
        let Some((_, path)) = &self.watch else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .filter_map(Result::ok)
            .map(|e| {
                if e.get("object").is_some() {
                    e["object"].clone()
                } else {
                    e
                }
            })
            .filter(|p| p["metadata"]["name"] == name)
            .collect()
    }

    /// The Manager's process for the pod `uid`, seen from this (host) PID
    /// namespace: the process whose environment names that pod uid.
    fn manager_pid(&self, uid: &str) -> Option<u32> {
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            if !cmdline.starts_with(b"/nexo-manager") {
                continue;
            }
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let needle = format!("POD_UID={uid}");
            if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
                return Some(pid);
            }
        }
        None
    }
}

/// Installs `manifests/` (through a kustomize overlay that changes only the
/// image, the CP URL and CA, the Proxy image, the heartbeat interval and
/// the service-account token's lifetime, and fills in the connect token),
/// and waits for the pod to be Ready.
fn install(bed: &mut Bed) {
    if bed.watch.is_some() {
        return;
    }
    let token = bed.sim.add_environment(&bed.env_id);
    let overlay = bed.node_dir.join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    let base = overlay.join("base");
    let _ = std::fs::remove_dir_all(&base);
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests"),
        &base,
    );
    let (repo, digest) = bed.images.manager.split_once('@').unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
# README.md's order: the CRDs' base, the namespace, the Manager's base; the
# token Secret beside them (here generated, as a user's overlay may).
resources:
  - base/crds
  - base/namespace.yaml
  - base
  # These scenarios deploy in the Manager's own namespace, which ships
  # without an executor (no command may write there): this overlay adds
  # one, as README.md \"Adding a managed namespace\" does for another.
  - executor.yaml
images:
  - name: registry.example.com/nexo/manager
    newName: {repo}
    digest: {digest}
configMapGenerator:
  - name: nexo-cp-ca
    namespace: {NS}
    files:
      - ca.crt
secretGenerator:
  - name: nexo-connect-token
    namespace: {NS}
    literals:
      - connect-token={token}
generatorOptions:
  disableNameSuffixHash: true
patches:
  - path: deployment-patch.yaml
"
        ),
    )
    .unwrap();
    std::fs::write(overlay.join("ca.crt"), bed.sim.ca_pem()).unwrap();
    std::fs::write(
        overlay.join("executor.yaml"),
        format!(
            "apiVersion: v1
kind: ServiceAccount
metadata:
  name: nexo-executor
  namespace: {NS}
automountServiceAccountToken: false
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: nexo-executor
  namespace: {NS}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: nexo-manager-executor
subjects:
  - kind: ServiceAccount
    name: nexo-executor
    namespace: {NS}
"
        ),
    )
    .unwrap();
    std::fs::write(
        overlay.join("deployment-patch.yaml"),
        format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: nexo-manager
  namespace: {NS}
spec:
  template:
    spec:
      containers:
        - name: manager
          env:
            - name: NEXO_CONTROL_PLANE_URL
              value: {url}
            - name: NEXO_CONTROL_PLANE_CA_FILE
              value: /var/run/nexo-cp-ca/ca.crt
            - name: NEXO_PROXY_IMAGE
              value: {proxy}
            - name: NEXO_HEARTBEAT_INTERVAL
              value: {interval}s
            - name: NEXO_SELF_UPGRADE_DEADLINE
              value: {deadline}s
            - name: RUST_LOG
              value: debug
          volumeMounts:
            - name: cp-ca
              mountPath: /var/run/nexo-cp-ca
              readOnly: true
            - name: short-lived-token
              mountPath: /var/run/secrets/kubernetes.io/serviceaccount
              readOnly: true
      # The service-account token the kubelet would mount, but living 10
      # minutes (the API server's minimum) instead of the default hour
      # (which the API server extends to a year): the kubelet rotates it
      # after 8, within the test.
      automountServiceAccountToken: false
      volumes:
        - name: cp-ca
          configMap:
            name: nexo-cp-ca
        - name: short-lived-token
          projected:
            sources:
              - serviceAccountToken:
                  path: token
                  expirationSeconds: 600
              - configMap:
                  name: kube-root-ca.crt
                  items:
                    - key: ca.crt
                      path: ca.crt
              - downwardAPI:
                  items:
                    - path: namespace
                      fieldRef:
                        fieldPath: metadata.namespace
",
            url = bed.sim.url(),
            proxy = bed.images.proxy,
            interval = INTERVAL.as_secs(),
            deadline = SELF_UPGRADE_DEADLINE.as_secs(),
        ),
    )
    .unwrap();
    let overlay_arg = overlay.display().to_string();
    bed.kubectl_ok(&["apply", "--server-side", "-k", &overlay_arg]);
    // The pods' watch, kept for the whole run.
    let watch_out = bed.node_dir.join("pods-watch.json");
    let child = bed
        .tb
        .kubectl_cmd()
        .args([
            "-n",
            NS,
            "get",
            "pods",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(std::fs::File::create(&watch_out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get pods -w");
    bed.watch = Some((child, watch_out));
    bed.kubectl_ok(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deployment/nexo-manager",
        "--timeout=120s",
    ]);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Each pod's name and conditions (type, status, reason, time), one line.
fn conditions(pods: &[Value]) -> String {
    pods.iter()
        .map(|p| {
            let conditions: Vec<String> = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    format!(
                        "{}={} {} {}",
                        c["type"].as_str().unwrap_or("?"),
                        c["status"].as_str().unwrap_or("?"),
                        c["reason"].as_str().unwrap_or(""),
                        c["lastTransitionTime"].as_str().unwrap_or("")
                    )
                })
                .collect();
            format!(
                "{}: {}",
                p["metadata"]["name"].as_str().unwrap_or("?"),
                conditions.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

fn image_of(pod: &Value) -> String {
    pod["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn restarts(pod: &Value) -> u64 {
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or(0)
}

fn connected_uids(bed: &Bed) -> Vec<(SystemTime, String)> {
    bed.sim
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/connect") && r.status == 200)
        .filter_map(|r| Some((r.at, r.json?["instance"]["id"].as_str()?.to_owned())))
        .collect()
}

/// Waits for `n` heartbeats after the last connect from the pod `uid`;
/// returns when the first of them arrived.
fn heartbeats_from(bed: &Bed, uid: &str, n: usize) -> SystemTime {
    wait_for(
        Duration::from_secs(30),
        &format!("{n} heartbeats from pod {uid}"),
        || {
            let (at, _) = connected_uids(bed)
                .into_iter()
                .rev()
                .find(|(_, u)| u == uid)?;
            let after: Vec<SystemTime> = bed
                .heartbeat_times()
                .into_iter()
                .filter(|t| *t > at)
                .collect();
            (after.len() >= n).then(|| after[0])
        },
    )
}

/// The longest gap between two successful heartbeats from `since` on.
fn longest_gap(bed: &Bed, since: SystemTime) -> Duration {
    let times: Vec<SystemTime> = bed
        .heartbeat_times()
        .into_iter()
        .filter(|t| *t >= since)
        .collect();
    times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unwrap_or_default())
        .max()
        .unwrap_or_default()
}

fn liveness_failures(bed: &Bed) -> Vec<String> {
    let events = bed.json(&[
        "-n",
        NS,
        "get",
        "events",
        "--field-selector",
        "reason=Unhealthy",
    ]);
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.contains("Liveness"))
        .map(str::to_owned)
        .collect()
}

/// What a failed scenario prints.
fn report(bed: &Bed) {
    let mut out = String::new();
    for args in [
        vec!["get", "pods", "-A", "-o", "wide"],
        vec!["-n", NS, "get", "deployment", "nexo-manager", "-o", "yaml"],
        vec!["get", "events", "-A", "--sort-by=.lastTimestamp"],
    ] {
        out += &format!(
            "--- kubectl {}\n{}\n",
            args.join(" "),
            bed.kubectl(&args).unwrap_or_else(|e| e)
        );
    }
    let pods = bed.pods();
    out += &format!("--- pod conditions\n{}\n", conditions(&pods));
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        out += &format!(
            "--- logs of {name}\n{}\n",
            bed.kubectl(&["-n", NS, "logs", name, "--tail=80"])
                .unwrap_or_else(|e| e)
        );
    }
    let kubelet =
        std::fs::read_to_string(bed.node_dir.join("logs/kubelet.log")).unwrap_or_default();
    let tail: Vec<&str> = kubelet.lines().rev().take(40).collect();
    out += &format!(
        "--- kubelet log (last 40 lines)\n{}\n",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    out += &format!("--- simulator requests\n{}\n", bed.sim.log_dump());
    let _ = std::io::stdout().write_all(out.as_bytes());
}

// ----------------------------------------------------------- scenarios --

/// A file of an OCI archive (`tar -xO`).
fn archive_file(archive: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .expect("tar");
    assert!(out.status.success(), "no {name} in {}", archive.display());
    out.stdout
}

/// The Manager's archive is the multi-architecture image: an OCI image
/// index of a linux/amd64 and a linux/arm64 image. Each config says what
/// the Dockerfile says (user 65532:65532, entrypoint /nexo-manager) and its
/// architecture; both have the same base layer and an app layer whose
/// /nexo-manager is an ELF executable of that architecture.
fn image_config_matches_the_dockerfile(bed: &Bed) {
    let archive = bed.images_dir.join("manager.oci.tar");
    let layout: Value = serde_json::from_slice(&archive_file(&archive, "index.json")).unwrap();
    let blob = |digest: &Value| {
        let hex = digest
            .as_str()
            .unwrap()
            .strip_prefix("sha256:")
            .unwrap()
            .to_owned();
        archive_file(&archive, &format!("blobs/sha256/{hex}"))
    };
    let top = &layout["manifests"][0];
    assert_eq!(
        top["mediaType"], "application/vnd.oci.image.index.v1+json",
        "the image is an index: {top}"
    );
    let index: Value = serde_json::from_slice(&blob(&top["digest"])).unwrap();
    let dockerfile = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile.distroless"),
    )
    .unwrap();
    let line = |keyword: &str| {
        dockerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(keyword))
            .unwrap_or_else(|| panic!("no {keyword} in Dockerfile.distroless"))
            .trim()
            .to_owned()
    };
    let entrypoint: Value = serde_json::from_str(&line("ENTRYPOINT ")).unwrap();
    // The OCI annotations: the Dockerfile's org.opencontainers.image.*
    // labels, on the index, on each manifest and as each config's labels.
    let oci = oci_annotations(&dockerfile);
    assert_eq!(
        index["annotations"], oci,
        "the index's OCI annotations, as the Dockerfile's labels say"
    );
    let mut platforms = Vec::new();
    let mut bases = Vec::new();
    for entry in index["manifests"].as_array().unwrap() {
        let arch = entry["platform"]["architecture"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(entry["platform"]["os"], "linux", "{entry}");
        let manifest: Value = serde_json::from_slice(&blob(&entry["digest"])).unwrap();
        let config: Value = serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
        assert_eq!(config["architecture"], json!(arch), "{arch}: config");
        assert_eq!(
            config["config"]["User"].as_str(),
            Some(line("USER ").as_str())
        );
        assert_eq!(config["config"]["Entrypoint"], entrypoint);
        assert_eq!(
            manifest["annotations"], oci,
            "{arch}: the manifest's annotations"
        );
        assert_eq!(
            config["config"]["Labels"], oci,
            "{arch}: the config's labels"
        );
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 2, "{arch}: base and app layers");
        bases.push(layers[0]["digest"].clone());
        // The app layer's /nexo-manager: the ELF machine of `arch`.
        let layer = tempfile_in(
            bed,
            &format!("layer-{arch}.tar"),
            &blob(&layers[1]["digest"]),
        );
        let elf = archive_file(&layer, "nexo-manager");
        let machine = u16::from_le_bytes([elf[18], elf[19]]);
        let want = match arch.as_str() {
            "amd64" => 62,
            "arm64" => 183,
            other => panic!("unexpected architecture {other}"),
        };
        assert_eq!(machine, want, "{arch}: /nexo-manager's ELF machine");
        platforms.push(arch);
    }
    platforms.sort();
    assert_eq!(platforms, ["amd64", "arm64"]);
    assert_eq!(bases[0], bases[1], "one base layer for both");
}

/// The OCI annotations the image carries: the Dockerfile's
/// `LABEL org.opencontainers.image.*` lines with its build arguments as
/// tests/image/build-image.sh gives them (this version, the checkout's
/// commit and its time), each checked for its shape.
fn oci_annotations(dockerfile: &str) -> Value {
    let mut want = serde_json::Map::new();
    for l in dockerfile.lines() {
        let Some(kv) = l.strip_prefix("LABEL org.opencontainers.image.") else {
            continue;
        };
        let (k, v) = kv.split_once('=').expect("LABEL K=V");
        want.insert(
            format!("org.opencontainers.image.{k}"),
            json!(v.trim_matches('"')),
        );
    }
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .env("TZ", "UTC")
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    for (key, value) in [
        ("version", env!("CARGO_PKG_VERSION").to_owned()),
        ("revision", git(&["rev-parse", "HEAD"])),
        (
            "created",
            git(&[
                "log",
                "-1",
                "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
                "--format=%cd",
            ]),
        ),
    ] {
        let k = format!("org.opencontainers.image.{key}");
        assert!(
            want.get(&k)
                .is_some_and(|v| v.as_str().is_some_and(|v| v.starts_with("${"))),
            "Dockerfile.distroless: {k} is a build argument"
        );
        want.insert(k, json!(value));
    }
    for key in ["title", "description", "source", "licenses"] {
        assert!(
            want.contains_key(&format!("org.opencontainers.image.{key}")),
            "Dockerfile.distroless has no org.opencontainers.image.{key}"
        );
    }
    Value::Object(want)
}

/// Writes `data` to a file of the test's temporary folder, returns its path.
fn tempfile_in(bed: &Bed, name: &str, data: &[u8]) -> PathBuf {
    let path = bed.images_dir.join(name);
    std::fs::write(&path, data).unwrap();
    path
}

fn installed(bed: &Bed) {
    image_config_matches_the_dockerfile(bed);
    // `rollout status` saw the pod available, but once (one CI run in
    // many) a list a moment later showed it not Ready, younger than one
    // probe period: the readiness is waited for, and its conditions
    // printed if it was not there at first, so a flap shows its times.
    let first = bed.pods();
    if !first.iter().all(ready) {
        println!(
            "node: the pod was not Ready right after the rollout: {}",
            conditions(&first)
        );
    }
    let pods = wait_for(Duration::from_secs(60), "the pod to be Ready", || {
        let pods = bed.pods();
        (pods.len() == 1 && ready(&pods[0])).then_some(pods)
    });
    let pod = &pods[0];
    assert_eq!(image_of(pod), bed.images.manager);
    let pod_uid = uid(pod);
    wait_for(Duration::from_secs(30), "a heartbeat", || {
        (!bed.heartbeat_times().is_empty()).then_some(())
    });
    // The process as the kernel sees it: user 65532, read-only root.
    let pid = bed
        .manager_pid(&pod_uid)
        .expect("the Manager's process on the node");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uids.split_whitespace().skip(1).all(|u| u == "65532"),
        "runs as 65532: {uids}"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .expect("a root mount");
    assert!(
        root.split(' ')
            .nth(5)
            .is_some_and(|o| o.split(',').any(|o| o == "ro")),
        "the root filesystem is read-only: {root}"
    );
    // It reached the API server through the `kubernetes` Service (its only
    // way there: KUBERNETES_SERVICE_HOST), and the CP simulator directly.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|v| v == b"KUBERNETES_SERVICE_HOST=10.96.0.1"),
        "the in-cluster configuration points at the kubernetes Service"
    );
    let hb = bed.sim.last_heartbeat().unwrap();
    let kube_system = bed.json(&["get", "namespace", "kube-system"]);
    assert_eq!(hb["cluster"]["uid"], kube_system["metadata"]["uid"], "{hb}");
    assert_eq!(
        connected_uids(bed).last().map(|(_, u)| u.clone()),
        Some(pod_uid.clone())
    );
    assert_eq!(bed.lease_holder().as_deref(), Some(pod_uid.as_str()));
    assert_eq!(restarts(pod), 0);
}

fn legacy_deployment(name: &str, image: &str) -> Value {
    // Meets the restricted Pod Security profile of the namespace.
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "proxy", "image": image, "imagePullPolicy": "IfNotPresent",
                    "ports": [{"containerPort": 27017}],
                    "readinessProbe": {"tcpSocket": {"port": 27017}, "periodSeconds": 1},
                    "resources": {"limits": {"memory": "16Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                        "capabilities": {"drop": ["ALL"]}}}]}}}})
}

fn deploys(bed: &Bed) {
    let proxy = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders"},
        "spec": {"image": bed.images.proxy, "replicas": 1, "mongodb": {"secretRef": {"name": "orders-db"}}}});
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "orders-db"}, "stringData": {"uri": "mongodb://db:27017"}});
    bed.command("node-crd-1", "deploy", json!({"deployment": {"name": "orders", "namespace": NS}, "format": "crd", "manifests": [proxy, secret]}));
    let ack = bed.wait_ack("node-crd-1", Duration::from_secs(30));
    assert_eq!(ack["result"], "applied", "{ack}");
    bed.kubectl_ok(&["-n", NS, "get", "nexoproxy", "orders"]);

    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "billing"},
        "spec": {"selector": {"app": "billing"}, "ports": [{"port": 27017}]}});
    bed.command(
        "node-legacy-1",
        "deploy",
        json!({"deployment": {"name": "billing", "namespace": NS}, "format": "legacy",
        "manifests": [legacy_deployment("billing", &bed.images.proxy), svc]}),
    );
    let ack = bed.wait_ack("node-legacy-1", Duration::from_secs(30));
    assert_eq!(ack["result"], "applied", "{ack}");
    wait_for(
        Duration::from_secs(60),
        "the legacy Deployment's pod Ready",
        || {
            let d = bed.json(&["-n", NS, "get", "deployment", "billing"]);
            (d["status"]["readyReplicas"].as_u64() == Some(1)).then_some(())
        },
    );
    // Both are in the inventory the next heartbeats report.
    wait_for(
        Duration::from_secs(30),
        "both deployments in a heartbeat",
        || {
            let hb = bed.sim.last_heartbeat()?;
            (hb["managedProxyCount"] == 2).then_some(())
        },
    );
    // The legacy Deployment's status, from what its controller writes of
    // real pods (status.v1): available.
    let status_of = |name: &str| -> Option<Value> {
        let hb = bed.sim.last_heartbeat()?;
        let e = hb["deployments"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)?;
        Some(e["status"].clone())
    };
    wait_for(Duration::from_secs(60), "billing available", || {
        status_of("billing").filter(|s| s["phase"] == "available")
    });
    // Deployed again to an image of the allowed repository that does not
    // exist, with a 15 s progress deadline: failed, and the message says
    // what the kubelet says of its pod.
    let repository = bed.images.proxy.split('@').next().unwrap();
    let mut broken = legacy_deployment("billing", &format!("{repository}:absent"));
    broken["spec"]["progressDeadlineSeconds"] = json!(15);
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "billing"},
        "spec": {"selector": {"app": "billing"}, "ports": [{"port": 27017}]}});
    bed.command(
        "node-legacy-absent",
        "deploy",
        json!({"deployment": {"name": "billing", "namespace": NS}, "format": "legacy",
        "manifests": [broken, svc]}),
    );
    let ack = bed.wait_ack("node-legacy-absent", Duration::from_secs(30));
    assert_eq!(ack["result"], "applied", "{ack}");
    let failed = wait_for(
        Duration::from_secs(120),
        "billing failed with the kubelet's reason",
        || {
            status_of("billing").filter(|s| {
                s["phase"] == "failed"
                    && s["message"].as_str().is_some_and(|m| {
                        m.contains("ErrImagePull") || m.contains("ImagePullBackOff")
                    })
            })
        },
    );
    assert_eq!(failed["reason"], "ProgressDeadlineExceeded", "{failed}");
    let events = bed.json(&["-n", NS, "get", "events.v1.events.k8s.io"]);
    let progress_failed = events["items"].as_array().unwrap().iter().any(|e| {
        e["reason"] == "ProgressFailed"
            && e["regarding"]["name"] == "billing"
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("pod billing-"))
    });
    assert!(
        progress_failed,
        "a ProgressFailed Event naming the pod: {events}"
    );
    // Its pods would retry the pull for the scenarios after this one.
    bed.command(
        "node-legacy-uninstall",
        "uninstall",
        json!({"deployment": {"name": "billing", "namespace": NS}}),
    );
    let ack = bed.wait_ack("node-legacy-uninstall", Duration::from_secs(30));
    assert_eq!(ack["result"], "applied", "{ack}");
}

/// Upgrades to `image`; returns the ack.
fn upgrade(bed: &Bed, id: &str, image: &str) -> Value {
    bed.command(
        id,
        "upgrade",
        // The bundle it runs (manifests/): another digest, no downgrade.
        json!({"bundleVersion": env!("CARGO_PKG_VERSION"), "managerImage": image}),
    );
    bed.wait_ack(id, Duration::from_secs(30))
}

fn self_upgrade(bed: &Bed) {
    let old = bed
        .pods()
        .into_iter()
        .find(ready)
        .expect("a Ready Manager pod");
    let old_uid = uid(&old);
    let old_name = old["metadata"]["name"].as_str().unwrap().to_owned();
    let since = SystemTime::now();
    let ack = upgrade(bed, "node-upgrade-b", &bed.images.manager_b);
    assert_eq!(ack["result"], "applied", "{ack}");
    let new = wait_for(Duration::from_secs(120), "the new pod leading", || {
        let pods = bed.pods();
        let new = pods
            .iter()
            .find(|p| image_of(p) == bed.images.manager_b && ready(p))?;
        let holder = bed.lease_holder()?;
        (holder == uid(new) && bed.pod_by_uid(&old_uid).is_none()).then(|| new.clone())
    });
    let new_uid = uid(&new);
    heartbeats_from(bed, &new_uid, 2);
    // A bound with a reason: the README's failover bound, "up to 3
    // intervals" (the lease's duration), holds for a rolling update too.
    let gap = longest_gap(bed, since);
    assert!(
        gap <= INTERVAL * 3,
        "the longest heartbeat gap of the upgrade was {gap:?} (interval {INTERVAL:?})"
    );
    // The old pod's container ended with exit code 0 (SIGTERM, clean stop).
    let exit = wait_for(
        Duration::from_secs(30),
        "the old pod's exit code in the watch",
        || {
            bed.watched(&old_name).iter().rev().find_map(|p| {
                p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"].as_i64()
            })
        },
    );
    assert_eq!(exit, 0, "the old pod exited 0");
    assert_eq!(restarts(&new), 0);
    // The new pod says the upgrade is available (`rollback.v1`).
    let reported = wait_for(
        Duration::from_secs(30),
        "selfUpgrade available in a heartbeat",
        || {
            let hb = bed.sim.last_heartbeat()?;
            (hb["selfUpgrade"]["commandId"] == "node-upgrade-b"
                && hb["selfUpgrade"]["phase"] == "available")
                .then(|| hb["selfUpgrade"].clone())
        },
    );
    assert_eq!(reported["to"], env!("CARGO_PKG_VERSION"), "{reported}");
}

fn crashing_upgrade(bed: &Bed) {
    let leader = bed.leader();
    let ack = upgrade(bed, "node-upgrade-crash", &bed.images.manager_crash);
    assert_eq!(ack["result"], "applied", "{ack}");
    // The new pod crashes at start and never becomes Ready.
    wait_for(
        Duration::from_secs(90),
        "the crashing pod restarted",
        || {
            bed.pods()
                .iter()
                .find(|p| image_of(p) == bed.images.manager_crash)
                .is_some_and(|p| restarts(p) >= 1 && !ready(p))
                .then_some(())
        },
    );
    let before = bed.heartbeat_times().len();
    let since = SystemTime::now();
    wait_for(
        Duration::from_secs(60),
        "the old pod heartbeating on",
        || (bed.heartbeat_times().len() >= before + 3).then_some(()),
    );
    // The README's failover bound, 3 intervals: no gap that long.
    assert!(longest_gap(bed, since) <= INTERVAL * 3);
    assert_eq!(
        bed.lease_holder().as_deref(),
        Some(leader.as_str()),
        "the old pod keeps the lease"
    );
    // The stalled rollout is in the heartbeat.
    let stalled = wait_for(
        Duration::from_secs(60),
        "the stalled upgrade in a heartbeat",
        || {
            let hb = bed.sim.last_heartbeat()?;
            hb["inventoryErrors"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .find(|e| e.contains("upgrade stalled"))
                .map(str::to_owned)
        },
    );
    assert!(stalled.contains(&bed.images.manager_crash), "{stalled}");
    // Past NEXO_SELF_UPGRADE_DEADLINE the old pod, which applied the
    // upgrade, writes its own image back and says so (`rollback.v1`).
    let reported = wait_for(
        SELF_UPGRADE_DEADLINE + Duration::from_secs(60),
        "selfUpgrade rolledBack in a heartbeat",
        || {
            let hb = bed.sim.last_heartbeat()?;
            (hb["selfUpgrade"]["commandId"] == "node-upgrade-crash"
                && hb["selfUpgrade"]["phase"] == "rolledBack")
                .then(|| hb["selfUpgrade"].clone())
        },
    );
    let reason = reported["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("the new pods were not Ready within")
            || reason.starts_with("the Deployment reports ProgressDeadlineExceeded"),
        "{reported}"
    );
    bed.kubectl_ok(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deployment/nexo-manager",
        "--timeout=90s",
    ]);
    // The old pod never stopped: it keeps leading, its image the one
    // written back, the crashing pods gone.
    assert_eq!(
        bed.lease_holder().as_deref(),
        Some(leader.as_str()),
        "the old pod keeps the lease"
    );
    let pods = bed.pods();
    assert!(
        pods.iter().all(|p| image_of(p) != bed.images.manager_crash),
        "the crashing pods are gone"
    );
    let old = pods
        .iter()
        .find(|p| uid(p) == leader)
        .expect("the old pod is still there");
    assert_eq!(restarts(old), 0, "the old pod never restarted");
    let deployment = bed.json(&["-n", NS, "get", "deployment", "nexo-manager"]);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        image_of(old),
        "the Deployment runs the old pod's image again"
    );
    let events = bed.json(&["-n", NS, "get", "events.events.k8s.io"]);
    assert!(
        events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "RolledBack"
                && e["regarding"]["kind"] == "Deployment"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("node-upgrade-crash"))
        }),
        "a RolledBack Event on the Manager's Deployment"
    );
    wait_for(
        Duration::from_secs(30),
        "no stalled upgrade in the heartbeat",
        || {
            let hb = bed.sim.last_heartbeat()?;
            let stalled = hb["inventoryErrors"].as_array().is_some_and(|e| {
                e.iter()
                    .filter_map(Value::as_str)
                    .any(|e| e.contains("upgrade stalled"))
            });
            (!stalled).then_some(())
        },
    );
}

fn failover(bed: &Bed) {
    bed.kubectl_ok(&["-n", NS, "scale", "deployment/nexo-manager", "--replicas=2"]);
    wait_for(Duration::from_secs(90), "two Ready Manager pods", || {
        (bed.pods().iter().filter(|p| ready(p)).count() == 2).then_some(())
    });
    let proxy = |name: &str| {
        json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
            "spec": {"image": bed.images.proxy, "replicas": 1, "mongodb": {"secretRef": {"name": "x-db"}}}})
    };
    let payload = json!({"deployment": {"name": "inventory", "namespace": NS}, "format": "crd", "manifests": [proxy("inventory")]});
    bed.command("node-failover-1", "deploy", payload.clone());
    let first = bed.wait_ack("node-failover-1", Duration::from_secs(30));
    assert_eq!(first["result"], "applied", "{first}");
    let leader = bed.leader();
    let pod = bed.pod_by_uid(&leader).unwrap();
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let since = SystemTime::now();
    bed.kubectl_ok(&["-n", NS, "delete", "pod", &name, "--wait=false"]);
    let new_leader = wait_for(Duration::from_secs(60), "another pod leading", || {
        bed.lease_holder().filter(|h| *h != leader)
    });
    let first_beat = heartbeats_from(bed, &new_leader, 1);
    // Bounds with a reason: the README says failover "takes up to 3
    // intervals" (the lease's duration); a deleted pod's clean stop releases
    // the lease, so this one is well within.
    let handover = first_beat.duration_since(since).unwrap_or_default();
    assert!(
        handover <= INTERVAL * 3,
        "the new leader's first heartbeat came {handover:?} after the leader was deleted"
    );
    let gap = longest_gap(bed, since);
    assert!(
        gap <= INTERVAL * 3,
        "failover took a heartbeat gap of {gap:?}"
    );
    // The CP sends the same command again: the new leader acknowledges the
    // recorded result and executes nothing (a second execution would
    // report `unchanged`, not `created`).
    bed.command("node-failover-1", "deploy", payload);
    let again = wait_for(
        Duration::from_secs(30),
        "the second ack of node-failover-1",
        || {
            let acks: Vec<Value> = bed
                .sim
                .requests()
                .into_iter()
                .filter(|r| r.path.contains("/commands/node-failover-1/ack"))
                .filter_map(|r| r.json)
                .collect();
            (acks.len() >= 2).then(|| acks.last().unwrap().clone())
        },
    );
    // A second execution would say `unchanged`; the recorded result says
    // `created` (its resources, or none once its delivery was recorded).
    assert!(
        again["result"] == first["result"]
            && again["message"] == first["message"]
            && (again["resources"] == first["resources"] || again["resources"] == json!([])),
        "the recorded result, not a second execution: {again} after {first}"
    );
    assert_eq!(first["resources"][0]["action"], "created");
    bed.kubectl_ok(&["-n", NS, "scale", "deployment/nexo-manager", "--replicas=1"]);
    wait_for(Duration::from_secs(60), "one Manager pod", || {
        (bed.pods().len() == 1).then_some(())
    });
    // The survivor leads before the next scenario starts.
    bed.leader();
}

fn greedy(bed: &Bed) {
    let leader = bed.leader();
    let pod = bed.pod_by_uid(&leader).unwrap();
    let restarts_before = restarts(&pod);
    // A 100-command batch in one answer: deploys of a NexoProxy each.
    let proxy = |name: &str| {
        json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
            "spec": {"image": bed.images.proxy, "replicas": 1, "mongodb": {"secretRef": {"name": "x-db"}}}})
    };
    for i in 0..100 {
        let name = format!("batch-{i}");
        bed.command(&format!("node-batch-{i}"), "deploy", json!({"deployment": {"name": name, "namespace": NS}, "format": "crd", "manifests": [proxy(&name)]}));
    }
    wait_for(Duration::from_secs(120), "100 acks", || {
        (0..100)
            .all(|i| bed.ack(&format!("node-batch-{i}")).is_some())
            .then_some(())
    });
    for i in 0..100 {
        let ack = bed.ack(&format!("node-batch-{i}")).unwrap();
        assert_eq!(ack["result"], "applied", "{ack}");
    }
    // The most commands one answer may carry: 1,000, each refused at once
    // (an unknown class), each recorded and acknowledged.
    for i in 0..1000 {
        bed.command(&format!("node-many-{i}"), "teleport", json!({}));
    }
    wait_for(Duration::from_secs(300), "1,000 acks", || {
        let acks = bed.sim.acks();
        let n = acks
            .iter()
            .filter(|a| {
                a["commandId"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("node-many-"))
            })
            .count();
        (n == 1000).then_some(())
    });
    // The largest answer the protocol allows: close to 8 MiB, commands of
    // up to 2 MiB raw; each refused or applied, none takes the process down.
    let filler = "x".repeat(1 << 20);
    for i in 0..6 {
        let name = format!("big-{i}");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": filler}});
        bed.command(&format!("node-big-{i}"), "deploy", json!({"deployment": {"name": name, "namespace": NS}, "format": "crd", "manifests": [proxy(&name), cm]}));
    }
    // A command built to expand: a 256 KiB manifest of tiny values.
    let tiny = Value::Array(vec![json!({}); 87_000]);
    bed.command("node-expand", "deploy", json!({"deployment": {"name": "expand", "namespace": NS}, "format": "legacy",
        "manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "expand"}, "data": {"k": tiny}}]}));
    wait_for(
        Duration::from_secs(180),
        "acks of the greedy commands",
        || {
            ((0..6).all(|i| bed.ack(&format!("node-big-{i}")).is_some())
                && bed.ack("node-expand").is_some())
            .then_some(())
        },
    );
    let ack = bed.ack("node-expand").unwrap();
    assert_eq!(ack["result"], "failed", "{ack}");
    assert!(
        ack["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid payload: too large"),
        "{ack}"
    );
    let pod = bed.pod_by_uid(&leader).expect("the same pod still runs");
    assert_eq!(restarts(&pod), restarts_before, "no restart");
    assert!(
        pod["status"]["containerStatuses"][0]["lastState"]["terminated"].is_null(),
        "no OOM kill: {}",
        pod["status"]["containerStatuses"][0]
    );
    let failures = liveness_failures(bed);
    assert!(failures.is_empty(), "liveness failed: {failures:?}");
}

/// Figures, not assertions on speed: the memory of the Manager's container
/// as the kubelet reports it (`/metrics/resource`, what metrics-server and
/// `kubectl top` show) and as its cgroup accounts it, and the image sizes.
/// The one assertion is the shipped limit.
fn footprint(bed: &Bed) {
    let leader = bed.leader();
    let pod = bed.pod_by_uid(&leader).unwrap();
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let metrics = bed.kubectl_ok(&[
        "get",
        "--raw",
        "/api/v1/nodes/nexo-node/proxy/metrics/resource",
    ]);
    let working_set: f64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("container_memory_working_set_bytes{")
                && l.contains("container=\"manager\"")
                && l.contains(&format!("pod=\"{name}\""))
        })
        .and_then(|l| l.split(' ').nth(1)?.parse().ok())
        .expect("the manager container's working set in /metrics/resource");
    let pid = bed.manager_pid(&leader).unwrap();
    // The container's memory cgroup (v1), as runc mounts it into the
    // container: this process's /sys is the network namespace's.
    let memcg = PathBuf::from(format!("/proc/{pid}/root/sys/fs/cgroup/memory"));
    let read = |file: &str| -> u64 {
        std::fs::read_to_string(memcg.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (usage, peak, limit) = (
        read("memory.usage_in_bytes"),
        read("memory.max_usage_in_bytes"),
        read("memory.limit_in_bytes"),
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let mib = |b: f64| b / 1048576.0;
    println!("node footprint (pod {name}, after the scenarios above):");
    println!(
        "  working set (kubelet /metrics/resource): {:.2} MiB",
        mib(working_set)
    );
    println!(
        "  memory cgroup: usage {:.2} MiB, peak {:.2} MiB (memory.max_usage_in_bytes), limit {:.0} MiB",
        mib(usage as f64),
        mib(peak as f64),
        mib(limit as f64)
    );
    println!(
        "  process: VmRSS {}, VmHWM {}",
        field("VmRSS:"),
        field("VmHWM:")
    );
    for archive in ["manager.oci.tar", "proxy.oci.tar"] {
        let size = std::fs::metadata(bed.images_dir.join(archive))
            .unwrap()
            .len();
        println!(
            "  image archive {archive}: {size} B ({:.2} MiB, layers as uncompressed tar)",
            mib(size as f64)
        );
    }
    assert_eq!(limit, 32 << 20, "the shipped 32 MiB limit is in force");
    assert!(peak < limit, "the peak {peak} B stayed under the limit");
}

fn token_rotation(bed: &Bed) {
    let leader = bed.leader();
    let pid = bed.manager_pid(&leader).expect("the leader's process");
    let token_path = format!("/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token");
    let first = std::fs::read_to_string(&token_path).expect("the projected token");
    let exp = jwt_exp(&first);
    // The kubelet replaces the token at 80 % of its lifetime; the Manager
    // must go on working after the first token has expired.
    let deadline = Duration::from_secs(exp.saturating_sub(unix_now()) + 60);
    eprintln!(
        "node: waiting up to {deadline:?} for the projected token to be rotated and the first one to expire"
    );
    wait_for(deadline, "the kubelet rotating the projected token", || {
        let now = std::fs::read_to_string(&token_path).ok()?;
        (now != first).then_some(())
    });
    // Waiting for the clock itself: past the first token's expiry.
    while unix_now() < exp + 5 {
        std::thread::sleep(Duration::from_secs(5));
    }
    bed.command("node-after-rotation", "deploy", json!({"deployment": {"name": "rotated", "namespace": NS}, "format": "crd",
        "manifests": [{"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "rotated"},
            "spec": {"image": bed.images.proxy, "replicas": 1, "mongodb": {"secretRef": {"name": "x-db"}}}}]}));
    let ack = bed.wait_ack("node-after-rotation", Duration::from_secs(60));
    assert_eq!(ack["result"], "applied", "{ack}");
    assert_eq!(
        bed.lease_holder().as_deref(),
        Some(leader.as_str()),
        "the same pod leads"
    );
}

/// The README's `helm install`, beside the kustomize install: a release
/// of its own in a namespace of its own, for another environment. Its pod
/// becomes Ready under the chart's RBAC, heartbeats with the bundle version,
/// deploys and uninstalls; `helm uninstall` takes the pod and leaves the
/// CRDs and what it deployed.
fn helm_install(bed: &Bed) {
    const HNS: &str = "nexo-helm";
    let env_id = "node-helm-env";
    let token = bed.sim.add_environment(env_id);
    let manager_id = bed.sim.manager_id(env_id);
    let ca = bed.node_dir.join("helm-cp-ca.pem");
    std::fs::write(&ca, bed.sim.ca_pem()).unwrap();
    let helm = |args: &[&str]| {
        run_ok(
            helm_cmd(bed)
                .arg("--kubeconfig")
                .arg(&bed.tb.kubeconfig)
                .args(args),
        )
    };
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/nexo-manager");
    // Its API server egress is read at install from the endpoints the API
    // server publishes.
    let sets = chart_sets(bed, &token, HNS);
    let mut args = vec![
        "install",
        "nm",
        chart.to_str().unwrap(),
        "--namespace",
        HNS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "120s",
    ];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let ca_arg = format!("controlPlane.caBundle={}", ca.display());
    args.extend(["--set-file", &ca_arg]);
    helm(&args);

    let release = "app.kubernetes.io/instance=nm";
    let slice = bed.json(&["-n", "default", "get", "endpointslice", "kubernetes"]);
    let policy = bed.json(&["-n", HNS, "get", "networkpolicy", "nm-nexo-manager"]);
    let api = &policy["spec"]["egress"][1];
    assert_eq!(
        api["to"][0]["ipBlock"]["cidr"],
        format!(
            "{}/32",
            slice["endpoints"][0]["addresses"][0].as_str().unwrap()
        ),
        "the API server's endpoint, read at install: {policy}"
    );
    assert_eq!(
        api["ports"][0]["port"], slice["ports"][0]["port"],
        "{policy}"
    );
    let pods = bed.pods_of(HNS, release);
    assert_eq!(pods.len(), 1, "one pod of the release: {pods:?}");
    assert!(ready(&pods[0]), "helm --wait left a Ready pod");
    assert_eq!(image_of(&pods[0]), bed.images.manager);
    let hb = wait_for(
        Duration::from_secs(30),
        "a heartbeat of the chart's Manager",
        || {
            bed.sim
                .heartbeats()
                .into_iter()
                .rfind(|h| h["managerId"] == manager_id.as_str())
        },
    );
    assert_eq!(
        hb["releaseContract"]["bundleVersion"],
        env!("CARGO_PKG_VERSION"),
        "{hb}"
    );
    assert_eq!(hb["releaseContract"]["errors"], json!([]), "{hb}");
    assert!(hb.get("inventoryErrors").is_none(), "{hb}");

    let send = |id: &str, class: &str, payload: Value| {
        bed.sim.enqueue_command(
            env_id,
            json!({"id": id, "class": class, "issuedAt": "2026-12-03T00:00:00Z", "payload": payload}),
        );
        let ack = bed.wait_ack(id, Duration::from_secs(30));
        assert_eq!(ack["result"], "applied", "{ack}");
    };
    let proxy = |name: &str| {
        json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
            "spec": {"image": bed.images.proxy, "replicas": 1, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}})
    };
    for name in ["helm-orders", "helm-kept"] {
        send(
            &format!("helm-deploy-{name}"),
            "deploy",
            json!({"deployment": {"name": name, "namespace": HNS}, "format": "crd", "manifests": [proxy(name)]}),
        );
        bed.kubectl_ok(&["-n", HNS, "get", "nexoproxy", name]);
    }
    send(
        "helm-uninstall-orders",
        "uninstall",
        json!({"deployment": {"name": "helm-orders", "namespace": HNS}}),
    );
    assert!(
        bed.kubectl(&["-n", HNS, "get", "nexoproxy", "helm-orders"])
            .is_err()
    );

    helm(&[
        "uninstall",
        "nm",
        "--namespace",
        HNS,
        "--wait",
        "--timeout",
        "120s",
    ]);
    wait_for(Duration::from_secs(60), "the release's pod gone", || {
        bed.pods_of(HNS, release).is_empty().then_some(())
    });
    bed.kubectl_ok(&["get", "crd", "nexoproxies.nexo.io", "nexopipelines.nexo.io"]);
    bed.kubectl_ok(&["-n", HNS, "get", "nexoproxy", "helm-kept"]);
    // The kustomize-installed Manager went on beside it all.
    assert_eq!(bed.pods().len(), 1);
}

/// `helm` with its caches in the node test bed's folder.
fn helm_cmd(bed: &Bed) -> Command {
    let home = bed.node_dir.join("helm-home");
    let mut cmd = Command::new(&bed.tb.helm);
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    cmd
}

/// The chart values of the chart scenarios: the node's images, the
/// simulator, `namespace` managed, the CRDs left to the kustomize install,
/// a NetworkPolicy.
fn chart_sets(bed: &Bed, token: &str, namespace: &str) -> Vec<String> {
    let (repo, digest) = bed.images.manager.split_once('@').unwrap();
    vec![
        format!("image.repository={repo}"),
        format!("image.digest={digest}"),
        format!("controlPlane.url={}", bed.sim.url()),
        format!("connectToken.value={token}"),
        format!("proxyImage={}", bed.images.proxy),
        format!("heartbeatInterval={}s", INTERVAL.as_secs()),
        // The CRDs are the kustomize install's (manifests/crds), no
        // release's: a second release leaves them alone.
        "crds.install=false".to_owned(),
        // It deploys in its own namespace, listed so that it gets an
        // executor there (README.md, "Adding a managed namespace").
        format!("managedNamespaces={{{namespace}}}"),
        // A NetworkPolicy (this node's CNI, the bridge plugin, does not
        // enforce one).
        "networkPolicy.enabled=true".to_owned(),
        format!(
            "networkPolicy.controlPlaneCIDRs={{{}/32}}",
            bed.sim.addr().ip()
        ),
    ]
}

/// A GitOps install: `helm template` (where `lookup` reads nothing)
/// applied with `kubectl apply --server-side`, as Argo CD and Flux apply a
/// chart. The Manager runs; with `selfUpgrade: false` it refuses an
/// upgrade; with `selfUpgrade: true` the next sync takes a self-upgrade
/// back (the chart's README, "GitOps": the tool wins).
fn gitops(bed: &Bed) {
    const GNS: &str = "nexo-gitops";
    const MANAGER: &str = "gm-nexo-manager";
    let env_id = "node-gitops-env";
    let token = bed.sim.add_environment(env_id);
    let manager_id = bed.sim.manager_id(env_id);
    let ca = bed.node_dir.join("gitops-cp-ca.pem");
    std::fs::write(&ca, bed.sim.ca_pem()).unwrap();
    // The API server's endpoints, given as the README says (a render
    // cannot read them).
    let slice = bed.json(&["-n", "default", "get", "endpointslice", "kubernetes"]);
    let api_ip = slice["endpoints"][0]["addresses"][0].as_str().unwrap();
    let api_port = slice["ports"][0]["port"].as_u64().unwrap();
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/nexo-manager");
    let render = |self_upgrade: bool| -> PathBuf {
        let mut cmd = helm_cmd(bed);
        cmd.args([
            "template",
            "gm",
            chart.to_str().unwrap(),
            "--namespace",
            GNS,
        ]);
        let mut sets = chart_sets(bed, &token, GNS);
        sets.extend([
            format!("selfUpgrade={self_upgrade}"),
            format!("networkPolicy.apiServer.cidrs={{{api_ip}/32}}"),
            format!("networkPolicy.apiServer.port={api_port}"),
        ]);
        for set in &sets {
            cmd.args(["--set", set]);
        }
        cmd.arg("--set-file")
            .arg(format!("controlPlane.caBundle={}", ca.display()));
        let rendered = run_ok(&mut cmd);
        let path = bed
            .node_dir
            .join(format!("gitops-self-upgrade-{self_upgrade}.yaml"));
        std::fs::write(&path, rendered).unwrap();
        path
    };
    // A sync: server-side apply, taking every field Git names.
    let sync = |rendered: &Path| {
        bed.kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gitops-tool",
            "-f",
            rendered.to_str().unwrap(),
        ]);
        bed.kubectl_ok(&[
            "-n",
            GNS,
            "rollout",
            "status",
            &format!("deployment/{MANAGER}"),
            "--timeout=120s",
        ]);
    };
    let release = "app.kubernetes.io/instance=gm";
    let only_pod = |image: &str| {
        wait_for(
            Duration::from_secs(120),
            &format!("one Ready pod of {image}"),
            || {
                let pods = bed.pods_of(GNS, release);
                (pods.len() == 1 && ready(&pods[0]) && image_of(&pods[0]) == image)
                    .then(|| pods[0].clone())
            },
        )
    };
    let deployment_image = || {
        bed.json(&["-n", GNS, "get", "deployment", MANAGER])["spec"]["template"]["spec"]
            ["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let upgrade_to = |id: &str, image: &str| {
        bed.sim.enqueue_command(
            env_id,
            json!({"id": id, "class": "upgrade", "issuedAt": "2026-12-03T00:00:00Z", "requires": [],
                   "payload": {"bundleVersion": env!("CARGO_PKG_VERSION"), "managerImage": image}}),
        );
        bed.wait_ack(id, Duration::from_secs(30))
    };

    bed.kubectl_ok(&["create", "namespace", GNS]);
    let git_owns = render(false);
    let rendered = std::fs::read_to_string(&git_owns).unwrap();
    assert!(
        !rendered.contains("kind: PodDisruptionBudget"),
        "one replica, no PodDisruptionBudget"
    );
    sync(&git_owns);
    let pod = only_pod(&bed.images.manager);
    let hb = wait_for(
        Duration::from_secs(30),
        "a heartbeat of the rendered Manager",
        || {
            bed.sim
                .heartbeats()
                .into_iter()
                .rfind(|h| h["managerId"] == manager_id.as_str())
        },
    );
    assert_eq!(hb["releaseContract"]["errors"], json!([]), "{hb}");
    let policy = bed.json(&["-n", GNS, "get", "networkpolicy", MANAGER]);
    assert_eq!(
        policy["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"],
        format!("{api_ip}/32"),
        "the API server's endpoints as given: {policy}"
    );
    // Git owns the version: the Control Plane's upgrade is refused.
    let ack = upgrade_to("gitops-upgrade-refused", &bed.images.manager_b);
    assert_eq!(ack["result"], "failed", "{ack}");
    assert_eq!(deployment_image(), bed.images.manager);
    assert_eq!(uid(&only_pod(&bed.images.manager)), uid(&pod), "no rollout");

    // The Control Plane owns it (selfUpgrade: true): a self-upgrade runs,
    // and the next sync takes it back, Git's image winning.
    let cp_owns = render(true);
    sync(&cp_owns);
    only_pod(&bed.images.manager);
    let ack = upgrade_to("gitops-upgrade-applied", &bed.images.manager_b);
    assert_eq!(ack["result"], "applied", "{ack}");
    only_pod(&bed.images.manager_b);
    sync(&cp_owns);
    only_pod(&bed.images.manager);
    assert_eq!(deployment_image(), bed.images.manager, "the sync's image");

    bed.kubectl_ok(&[
        "delete",
        "--wait=true",
        "--timeout=120s",
        "-f",
        cp_owns.to_str().unwrap(),
    ]);
    wait_for(Duration::from_secs(60), "the rendered pods gone", || {
        bed.pods_of(GNS, release).is_empty().then_some(())
    });
    bed.kubectl_ok(&["delete", "namespace", GNS, "--wait=false"]);
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The `exp` claim of a JWT (no verification: the test only reads when the
/// kubelet's token expires).
fn jwt_exp(token: &str) -> u64 {
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64url(payload);
    let claims: Value = serde_json::from_slice(&bytes).expect("JWT claims");
    claims["exp"].as_u64().expect("an exp claim")
}

fn base64url(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
