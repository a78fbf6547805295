//! One test's world: a fresh namespace on the real test bed, a CP simulator
//! with one environment, and the Manager's environment variables.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};

use super::manager::Manager;
use super::{Namespace, Testbed, testbed};

static ENV_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The configured Proxy image of every test.
pub const PROXY_IMAGE: &str = "registry.example.com/nexo/proxy:1.4.2";

/// A test's world.
pub struct Fixture {
    /// The test bed.
    pub tb: &'static Testbed,
    /// The Manager's own (and managed) namespace.
    pub ns: Namespace,
    /// The CP simulator.
    pub sim: Arc<Simulator>,
    /// The environment id.
    pub env_id: String,
    /// Its connect token.
    pub token: String,
    /// Files of this test: token, CA.
    pub dir: PathBuf,
}

impl Fixture {
    /// A new world; `prefix` names the namespace.
    pub fn new(prefix: &str) -> Fixture {
        Fixture::with_config(prefix, SimConfig::default())
    }

    /// A new world with a simulator configured by `config`.
    pub fn with_config(prefix: &str, config: SimConfig) -> Fixture {
        Fixture::on(testbed(), prefix, config)
    }

    /// A new world on the test bed `tb` (one of the caller's own).
    pub fn on(tb: &'static Testbed, prefix: &str, config: SimConfig) -> Fixture {
        let ns = tb.namespace(prefix);
        super::grant_executor(tb, &ns.name, &super::executor_rules());
        let sim = Arc::new(Simulator::start(config));
        let env_id = format!(
            "env-{}-{}",
            std::process::id(),
            ENV_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let token = sim.add_environment(&env_id);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fixture-{}", ns.name));
        std::fs::create_dir_all(&dir).unwrap();
        sim.write_ca(&dir.join("cp-ca.pem"));
        std::fs::write(dir.join("connect-token"), &token).unwrap();
        Fixture {
            tb,
            ns,
            sim,
            env_id,
            token,
            dir,
        }
    }

    /// The path of the connect-token file.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("connect-token")
    }

    /// The Manager's environment: the admin kubeconfig, a 1 s interval,
    /// probes off, no command keys, `trace` logs (the run's log is
    /// searched for every token when it ends: [`Manager`]'s drop).
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let mut set = |k: &str, v: String| {
            env.insert(k.to_owned(), v);
        };
        set("NEXO_CONTROL_PLANE_URL", self.sim.url());
        set(
            "NEXO_CONTROL_PLANE_CA_FILE",
            self.dir.join("cp-ca.pem").display().to_string(),
        );
        set(
            "NEXO_CONNECT_TOKEN_FILE",
            self.token_file().display().to_string(),
        );
        set("NEXO_PROXY_IMAGE", PROXY_IMAGE.to_owned());
        set("NEXO_NAMESPACES", self.ns.name.clone());
        set("POD_NAMESPACE", self.ns.name.clone());
        set("POD_NAME", "nexo-manager-test".to_owned());
        set("POD_UID", format!("uid-{}", self.ns.name));
        set("KUBECONFIG", self.tb.kubeconfig.display().to_string());
        set("NEXO_HEARTBEAT_INTERVAL", "1s".to_owned());
        set("NEXO_LISTEN_ADDR", "off".to_owned());
        // No key file (unsigned commands accepted), whatever this machine
        // holds at the default path.
        set(
            "NEXO_COMMAND_KEYS_FILE",
            self.dir.join("no-command-keys").display().to_string(),
        );
        set("RUST_LOG", "trace".to_owned());
        env
    }

    /// [`Fixture::env`] of the pod `uid` (its name too): one of several
    /// Managers of the environment (leader election).
    pub fn pod_env(&self, uid: &str) -> BTreeMap<String, String> {
        let mut env = self.env();
        env.insert("POD_UID".into(), uid.into());
        env.insert("POD_NAME".into(), uid.into());
        env
    }

    /// Installs the CRDs and starts the Manager with probes on a port of
    /// its own (a test may read its /metrics), plus `extra` variables.
    pub fn spawn_with_probes(&self, extra: &[(&str, &str)]) -> Manager {
        self.tb.install_crds();
        let mut env = self.env();
        env.insert("NEXO_LISTEN_ADDR".into(), super::PROBES_ON_ANY_PORT.into());
        for (k, v) in extra {
            env.insert((*k).into(), (*v).into());
        }
        self.spawn(&env)
    }

    /// Starts the Manager with `env`.
    pub fn spawn(&self, env: &BTreeMap<String, String>) -> Manager {
        Manager::spawn(env).with_sim(&self.sim)
    }

    /// The uid of the test bed's `kube-system` namespace.
    pub fn cluster_uid(&self) -> String {
        let ns: Value = self
            .tb
            .admin()
            .get("/api/v1/namespaces/kube-system")
            .unwrap();
        ns["metadata"]["uid"].as_str().unwrap().to_owned()
    }

    /// The Events (`events.k8s.io/v1`) in the test's namespace, whoever
    /// reported them.
    pub fn events(&self) -> Vec<Value> {
        let list: Value = self
            .tb
            .admin()
            .get(&format!(
                "/apis/events.k8s.io/v1/namespaces/{}/events",
                self.ns.name
            ))
            .expect("list the namespace's Events");
        list["items"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("an Event list without items: {list}"))
    }

    /// Ownership labels of this environment.
    pub fn owned_labels(&self, deployment: &str) -> Value {
        json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": self.env_id, "nexo.io/deployment": deployment})
    }

    /// Creates a NexoProxy in the test namespace; one with this
    /// environment's labels ([`Fixture::owned_labels`]) gets the proof
    /// the Manager would have written ([`Fixture::prove`]).
    pub fn create_proxy(&self, name: &str, labels: Value, replicas: i64, image: &str) -> Value {
        let obj = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
            "metadata": {"name": name, "labels": labels},
            "spec": {"image": image, "replicas": replicas, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}});
        let collection = format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
            self.ns.name
        );
        let created = self
            .tb
            .admin()
            .create(&collection, &obj)
            .unwrap_or_else(|e| panic!("create NexoProxy {name}: {e}"));
        self.prove_if_owned(&collection, created)
    }

    /// The integrity key of this environment's Manager: read from its
    /// state Secret (waiting for a running Manager to make it), or made and
    /// written in a new one (before the Manager first starts, as an earlier
    /// Manager would have left it).
    pub fn integrity_key(&self) -> nexo_manager::integrity::Key {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let ns = self.ns.name.as_str();
        let path = format!("/api/v1/namespaces/{ns}/secrets/nexo-manager-state");
        let admin = self.tb.admin();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let existing: Option<Value> = admin.get_opt(&path).expect("read the state Secret");
            if let Some(secret) = existing {
                let text = secret["data"]["state.json"].as_str().expect("state.json");
                let doc: Value = serde_json::from_slice(&b64.decode(text).unwrap()).unwrap();
                if let Some(stored) = doc["integrityKey"].as_str() {
                    return nexo_manager::integrity::Key::from_stored(stored).unwrap();
                }
                // A Manager made the state and is about to make its key.
                assert!(
                    std::time::Instant::now() < deadline,
                    "the state Secret {path} has no integrityKey after 60 s"
                );
                std::thread::sleep(std::time::Duration::from_millis(200));
                continue;
            }
            let (key, stored) = nexo_manager::integrity::Key::generate().unwrap();
            let doc = json!({"version": 1, "integrityKey": stored});
            let secret = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "nexo-manager-state", "labels": {
                    "app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": self.env_id,
                    "nexo.io/role": "manager-state"}},
                "data": {"state.json": b64.encode(doc.to_string())}});
            match admin.create(&format!("/api/v1/namespaces/{ns}/secrets"), &secret) {
                Ok(_) => return key,
                // A Manager made it meanwhile: read it.
                Err(e) if e.status() == Some(409) => {}
                Err(e) => panic!("create the state Secret with a key: {e}"),
            }
        }
    }

    /// The proof this environment's Manager writes on `object`
    /// ([`super::proof_of`]).
    pub fn proof_of(&self, object: &Value) -> String {
        super::proof_of(&self.integrity_key(), &self.env_id, object)
    }

    /// Writes the Manager's proof on `object` of `collection`, as a
    /// Manager writes it on what it creates; the object as written.
    pub fn prove(&self, collection: &str, object: &Value) -> Value {
        let key = self.integrity_key();
        super::prove_with(&self.tb.admin(), &key, &self.env_id, collection, object)
    }

    /// [`Fixture::prove`] when the labels are this environment's and name
    /// a deployment; the object as it is otherwise.
    fn prove_if_owned(&self, collection: &str, created: Value) -> Value {
        let labels = &created["metadata"]["labels"];
        let owned = labels["app.kubernetes.io/managed-by"] == "nexo-manager"
            && labels["nexo.io/owner-id"] == self.env_id.as_str()
            && labels["nexo.io/deployment"].is_string();
        if owned {
            self.prove(collection, &created)
        } else {
            created
        }
    }

    /// Creates an apps/v1 Deployment in the test namespace.
    pub fn create_deployment(
        &self,
        name: &str,
        labels: Value,
        replicas: i64,
        image: &str,
    ) -> Value {
        let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "proxy", "image": image}]}}}});
        let collection = format!("/apis/apps/v1/namespaces/{}/deployments", self.ns.name);
        let created = self
            .tb
            .admin()
            .create(&collection, &obj)
            .unwrap_or_else(|e| panic!("create Deployment {name}: {e}"));
        self.prove_if_owned(&collection, created)
    }
}
