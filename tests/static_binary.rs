//! The static release binary (`$NEXO_STATIC_BINARY`, built by tests/run.sh
//! with the Dockerfile's command) has no dynamic dependency and works in an
//! empty root holding nothing but itself, the CA file, the token and a
//! kubeconfig: what the distroless image gives it.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::fixture::Fixture;
use support::manager::static_binary;

#[test]
fn the_static_binary_has_no_dynamic_dependency() {
    let out = Command::new("ldd")
        .arg(static_binary())
        .output()
        .expect("run ldd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("not a dynamic executable") || text.contains("statically linked"),
        "ldd says:\n{text}"
    );
}

#[test]
fn the_static_binary_heartbeats_from_an_empty_root() {
    let f = Fixture::new("static");
    let root = f.dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(static_binary(), root.join("nexo-manager")).unwrap();
    std::fs::copy(f.dir.join("cp-ca.pem"), root.join("cp-ca.pem")).unwrap();
    std::fs::write(root.join("connect-token"), &f.token).unwrap();
    // A self-contained kubeconfig: certificates inline, nothing outside the root.
    let read = |name: &str| base64(&std::fs::read(f.tb.dir.join(name)).unwrap());
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "t", "cluster": {"server": f.tb.server, "certificate-authority-data": read("ca.crt")}}],
        "users": [{"name": "u", "user": {"client-certificate-data": read("admin.crt"), "client-key-data": read("admin.key")}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
        "current-context": "t"
    });
    std::fs::write(root.join("kubeconfig"), kubeconfig.to_string()).unwrap();
    let entries: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries.len(), 4, "the root holds only {entries:?}");

    let mut env = f.env();
    env.insert("NEXO_CONTROL_PLANE_CA_FILE".into(), "/cp-ca.pem".into());
    env.insert("NEXO_CONNECT_TOKEN_FILE".into(), "/connect-token".into());
    env.insert("KUBECONFIG".into(), "/kubeconfig".into());
    let mut child = Command::new("/usr/sbin/chroot")
        .arg(&root)
        .arg("/nexo-manager")
        .env_clear()
        .envs(&env)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(f.dir.join("static.log")).unwrap())
        .spawn()
        .expect("chroot (the tests run as root)");
    let ok = (0..300).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        !f.sim.heartbeats().is_empty() || child.try_wait().unwrap().is_some()
    });
    let log = std::fs::read_to_string(f.dir.join("static.log")).unwrap_or_default();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = child.wait().unwrap();
    assert!(
        ok && !f.sim.heartbeats().is_empty(),
        "no heartbeat from the empty root; exit {status:?}\nlog:\n{log}\nsimulator:\n{}",
        f.sim.log_dump()
    );
    assert!(
        status.success(),
        "SIGTERM ends it with exit 0: {status:?}\n{log}"
    );
}

/// Standard base64, for the inline kubeconfig.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}
