//! The arm64 release binary (`$NEXO_STATIC_BINARY_ARM64`, built by
//! `tests/build-static.sh arm64`), proven rather than only built: it runs
//! under qemu-user's aarch64 emulator against the real test bed and the CP
//! simulator through the agent's main path: connect and bind, a heartbeat
//! with its inventory, a deploy and its ack, the inventory showing the
//! deployment, and a clean stop on SIGTERM.

mod support;

use std::time::Duration;

use serde_json::json;
use support::commands::{command, configmap, proxy, wait_ack, wait_heartbeat};
use support::fixture::Fixture;
use support::manager::{Manager, arm64_binary, qemu_aarch64};

/// The ELF header's machine field for AArch64 (EM_AARCH64).
const EM_AARCH64: u16 = 183;
/// The size budget of the arm64 binary (issue: at most 3 MiB).
const MAX_SIZE: u64 = 3 * 1024 * 1024;

/// The binary is a static little-endian 64-bit AArch64 executable within
/// the budget: no program interpreter (PT_INTERP) to look for in the image.
#[test]
fn the_arm64_binary_is_a_static_aarch64_executable_of_at_most_3_mib() {
    let path = arm64_binary();
    let elf = std::fs::read(&path).unwrap();
    assert_eq!(
        &elf[..4],
        b"\x7fELF",
        "{} is not an ELF file",
        path.display()
    );
    assert_eq!(elf[4], 2, "not a 64-bit ELF");
    assert_eq!(elf[5], 1, "not little-endian");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(u16_at(18), EM_AARCH64, "e_machine is not AArch64");
    let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54) as usize, u16_at(56));
    let interp = (0..phnum as usize).any(|i| u32_at(phoff + i * phentsize) == 3);
    assert!(!interp, "a program interpreter is requested: not static");
    let size = elf.len() as u64;
    eprintln!("arm64 binary: {size} bytes");
    assert!(size <= MAX_SIZE, "{size} bytes, over the 3 MiB budget");
}

#[test]
fn the_arm64_binary_connects_heartbeats_deploys_acks_and_stops_under_qemu() {
    let f = Fixture::new("arm64");
    f.tb.install_crds();
    // Something to inventory from the start: an owned NexoProxy.
    f.create_proxy(
        "billing",
        f.owned_labels("billing"),
        1,
        "registry.example.com/nexo/proxy:1.4.2",
    );
    let mut m =
        Manager::spawn_emulated(&qemu_aarch64(), &arm64_binary(), &f.env()).with_sim(&f.sim);

    // Connect: the binding names this cluster.
    let connect = || {
        f.sim
            .requests()
            .into_iter()
            .find(|r| r.path.ends_with("/connect") && r.status == 200)
            .and_then(|r| r.json)
    };
    m.wait_until(Duration::from_secs(60), "a connect", || connect().is_some());
    let connect = connect().unwrap();
    m.check(
        connect["cluster"]["uid"] == json!(f.cluster_uid()),
        &format!("the connect names this cluster: {connect}"),
    );
    m.check(
        connect["cluster"]["kubernetesVersion"] == json!(f.tb.version),
        &format!("the connect carries the API server's version: {connect}"),
    );

    // A heartbeat with the inventory.
    wait_heartbeat(&f, &mut m, 0, "a heartbeat listing billing", |hb| {
        hb["deployments"]
            .as_array()?
            .iter()
            .any(|d| d["name"] == "billing")
            .then_some(())
    });

    // A deploy, applied in the cluster, and its ack.
    let name = "orders";
    let payload = json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy(name), configmap(&format!("{name}-config"))]});
    f.sim
        .enqueue_command(&f.env_id, command("arm64-deploy-1", "deploy", payload));
    let ack = wait_ack(&f, &mut m, "arm64-deploy-1");
    m.check(
        ack["result"] == "applied",
        &format!("deploy applied: {ack}"),
    );
    let admin = f.tb.admin();
    let got: Option<serde_json::Value> = admin
        .get_opt(&support::commands::ns_path(&f, "NexoProxy", name))
        .unwrap();
    let got = got.unwrap_or_else(|| m.fail("the deployed NexoProxy is not in the cluster"));
    m.check(
        got["metadata"]["labels"]["nexo.io/owner-id"] == json!(f.env_id),
        &format!("the NexoProxy is labelled as the environment's: {got}"),
    );

    // The next heartbeats list it.
    let seen = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, seen, "a heartbeat listing orders", |hb| {
        hb["deployments"]
            .as_array()?
            .iter()
            .any(|d| d["name"] == name)
            .then_some(())
    });

    // SIGTERM, sent to the emulator, reaches the program: a clean exit 0.
    m.stop_expecting_exit_0();
}
