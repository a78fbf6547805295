//! `POST /api/v2/manager/connect`: who the Manager is, and the session
//! and binding the CP answers with.

use serde::{Deserialize, Serialize};

/// `manager` in the connect body.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ManagerInfo {
    /// Manager build version.
    pub version: String,
    /// Build identifier.
    pub build: String,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
}

/// `instance` in the connect body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInfo {
    /// Pod uid, else hostname.
    pub id: String,
    pub pod_name: String,
    /// The Manager's namespace.
    pub namespace: String,
}

/// `cluster` in the connect body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// `metadata.uid` of the `kube-system` namespace.
    pub uid: String,
    /// The API server's `gitVersion`.
    pub kubernetes_version: String,
}

/// `POST /api/v2/manager/connect` request body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    /// Always [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
    pub protocol_version: u32,
    /// This build.
    pub manager: ManagerInfo,
    /// This process.
    pub instance: InstanceInfo,
    /// This cluster.
    pub cluster: ClusterRef,
}

/// `POST /api/v2/manager/connect` 200 body.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectResponse {
    /// Must equal the token's environment id.
    pub environment_id: String,
    /// The id the CP gave this Manager.
    pub manager_id: String,
    /// Bearer token of the session.
    pub session_token: String,
    /// When the session expires (RFC 3339), if the CP says.
    #[serde(default)]
    pub session_expires_at: Option<String>,
    /// Interval override, seconds.
    #[serde(default)]
    pub heartbeat_interval_seconds: Option<u64>,
}
