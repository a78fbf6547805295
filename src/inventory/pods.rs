//! Why a legacy Deployment's pods do not run, decided from plain values:
//! the pods its own ReplicaSets own ([`own_pods`]), and what the kubelet
//! and the scheduler say of them ([`pod_reason`]). The reads are
//! `inventory::pod_reason`'s.

/// The uid of the controller that owns `object`, if any.
fn controller_uid(object: &serde_json::Value) -> Option<&str> {
    crate::ownership::controller(object)?["uid"].as_str()
}

/// The pods of the Deployment whose uid is `deployment`: those a
/// ReplicaSet among `sets` controls, that ReplicaSet being controlled by
/// the Deployment. A pod that merely matches the selector (another
/// controller's, a tenant's) is not one of them.
pub fn own_pods(
    deployment: &str,
    sets: &[serde_json::Value],
    pods: Vec<serde_json::Value>,
) -> Vec<serde_json::Value> {
    let own: Vec<&str> = sets
        .iter()
        .filter(|rs| controller_uid(rs) == Some(deployment))
        .filter_map(|rs| rs["metadata"]["uid"].as_str())
        .collect();
    pods.into_iter()
        .filter(|pod| controller_uid(pod).is_some_and(|uid| own.contains(&uid)))
        .collect()
}

/// Why the pods of a legacy Deployment do not run, as the kubelet and
/// the scheduler say: the first container waiting for a reason other than
/// its start (`ImagePullBackOff`, `CrashLoopBackOff`, ...), else the first
/// that ended in error, else a pod that cannot be scheduled.
/// `pod <name>: <reason>: <message>`.
pub fn pod_reason(pods: &[serde_json::Value]) -> Option<String> {
    let say = |pod: &serde_json::Value, reason: &str, message: Option<&str>| {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        match message.filter(|m| !m.is_empty()) {
            Some(m) => format!("pod {name}: {reason}: {m}"),
            None => format!("pod {name}: {reason}"),
        }
    };
    let statuses = |pod: &'_ serde_json::Value| {
        let s = &pod["status"];
        let init = s["initContainerStatuses"].as_array().into_iter().flatten();
        init.chain(s["containerStatuses"].as_array().into_iter().flatten())
            .cloned()
            .collect::<Vec<_>>()
    };
    for pod in pods {
        for c in statuses(pod) {
            let waiting = &c["state"]["waiting"];
            if let Some(reason) = waiting["reason"].as_str()
                && !matches!(reason, "ContainerCreating" | "PodInitializing")
            {
                return Some(say(pod, reason, waiting["message"].as_str()));
            }
        }
    }
    for pod in pods {
        for c in statuses(pod) {
            let ended = &c["lastState"]["terminated"];
            if let Some(reason) = ended["reason"].as_str()
                && ended["exitCode"].as_i64().is_some_and(|code| code != 0)
            {
                return Some(say(pod, reason, ended["message"].as_str()));
            }
        }
    }
    pods.iter().find_map(|pod| {
        let c = pod["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")?;
        Some(say(
            pod,
            c["reason"].as_str().unwrap_or("Unschedulable"),
            c["message"].as_str(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_kubelets_reason_is_the_first_container_that_waits_for_one() {
        let starting = json!({"metadata": {"name": "b-1"}, "status": {"containerStatuses": [
            {"state": {"waiting": {"reason": "ContainerCreating"}}}]}});
        let pulling = json!({"metadata": {"name": "b-2"}, "status": {"containerStatuses": [
            {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"p:absent\""}}}]}});
        assert_eq!(
            pod_reason(&[starting.clone(), pulling]).as_deref(),
            Some("pod b-2: ImagePullBackOff: Back-off pulling image \"p:absent\"")
        );
        assert_eq!(pod_reason(std::slice::from_ref(&starting)), None);
        let crashed = json!({"metadata": {"name": "b-3"}, "status": {"containerStatuses": [
            {"state": {"running": {}}, "lastState": {"terminated": {"reason": "Error", "exitCode": 2}}}]}});
        assert_eq!(pod_reason(&[crashed]).as_deref(), Some("pod b-3: Error"));
        let pending = json!({"metadata": {"name": "b-4"}, "status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}]}});
        assert_eq!(
            pod_reason(&[pending]).as_deref(),
            Some("pod b-4: Unschedulable: 0/1 nodes are available")
        );
    }

    #[test]
    fn only_the_pods_of_the_deployments_own_replica_sets_are_read() {
        let owned_by = |uid: &str| json!([{"uid": uid, "controller": true}]);
        let rs = |name: &str, uid: &str, owner: &str| json!({"metadata": {"name": name, "uid": uid, "ownerReferences": owned_by(owner)}});
        let pod = |name: &str, owner: serde_json::Value| json!({"metadata": {"name": name, "ownerReferences": owner}});
        let sets = [
            rs("billing-1", "rs-1", "dep"),
            rs("other-1", "rs-2", "stranger"),
        ];
        let pods = vec![
            pod("billing-1-a", owned_by("rs-1")),
            // Another ReplicaSet's, an orphan, a controller's that is not one.
            pod("other-1-a", owned_by("rs-2")),
            pod("orphan", json!(null)),
            pod("job", json!([{"uid": "rs-1", "controller": false}])),
        ];
        let names: Vec<_> = own_pods("dep", &sets, pods)
            .into_iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["billing-1-a"]);
        assert!(own_pods("dep", &[], vec![pod("billing-1-a", owned_by("rs-1"))]).is_empty());
    }
}
