//! The server side of protocol version 2, as functions over [`State`]: no
//! sockets here, so every rule is testable directly.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::http::Response;

/// One registered environment.
#[derive(Debug, Clone)]
pub struct Environment {
    /// Its current connect token.
    pub token: String,
    /// The cluster uid it is bound to.
    pub bound: Option<String>,
    /// Commands waiting for the next heartbeat.
    pub queue: VecDeque<Value>,
    /// Ids of commands delivered in a heartbeat.
    pub delivered: HashSet<String>,
    /// Ids of commands acknowledged.
    pub acked: HashSet<String>,
    /// Commands delivered and not yet acknowledged, with when they were
    /// last sent: sent again after [`State::redeliver_after`].
    pub outstanding: Vec<(Value, SystemTime)>,
    /// When set, every queued command is signed with it.
    pub signer: Option<std::sync::Arc<crate::signing::Signer>>,
}

impl Environment {
    /// Queues a command, signed when the environment has a signer.
    pub fn enqueue(&mut self, env: &str, command: Value) {
        let command = match &self.signer {
            Some(s) => s.sign(env, &command),
            None => command,
        };
        self.queue.push_back(command);
    }
}

/// A live session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Its environment.
    pub env: String,
    /// When it stops being accepted.
    pub expires: SystemTime,
}

/// Everything the simulated CP knows.
#[derive(Debug)]
pub struct State {
    /// Environments by id.
    pub envs: BTreeMap<String, Environment>,
    /// Sessions by token.
    pub sessions: HashMap<String, Session>,
    /// Heartbeat bodies answered 200.
    pub heartbeats: Vec<Value>,
    /// Accepted acks, direct or pending.
    pub acks: Vec<Value>,
    /// Interval sent in 200 bodies, if any.
    pub interval: Option<u64>,
    /// The `instance.id` of the connect that issued each session token,
    /// kept after the session expires.
    pub issued_to: HashMap<String, String>,
    /// Session lifetime.
    pub ttl: Duration,
    /// A command delivered and not acknowledged this long is sent again, in
    /// the order first sent and before new ones (docs/protocol.md: the CP sends
    /// unacknowledged commands again); `None`: never.
    pub redeliver_after: Option<Duration>,
    /// Inventories rebuilt from full forms and deltas.
    pub inventory: crate::inventory::Rebuilt,
    rng: u64,
}

/// The stable manager id of an environment.
pub fn manager_id(env: &str) -> String {
    // FNV-1a: stable across runs and processes.
    let mut h: u32 = 0x811c_9dc5;
    for b in env.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("mgr-{h:08x}")
}

/// An error answer with docs/protocol.md's body.
pub fn error(status: u16, code: &str, message: &str) -> Response {
    Response::json(
        status,
        &json!({"error": {"code": code, "message": message, "retryable": status >= 500 || status == 429}}),
    )
}

fn bearer(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .and_then(|(_, v)| v.strip_prefix("Bearer "))
}

/// Checks that `body[field]` exists and satisfies `ok`.
fn require(
    body: &Value,
    field: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Result<(), Response> {
    let v = field.split('.').fold(body, |v, k| &v[k]);
    if ok(v) {
        Ok(())
    } else {
        Err(error(
            400,
            "invalid_request",
            &format!("{field} must be {what}"),
        ))
    }
}

fn is_str(v: &Value) -> bool {
    v.is_string()
}

fn is_uint(v: &Value) -> bool {
    v.is_u64()
}

impl State {
    /// An empty CP.
    pub fn new(interval: Option<u64>, ttl: Duration) -> State {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        State {
            envs: BTreeMap::new(),
            sessions: HashMap::new(),
            heartbeats: Vec::new(),
            acks: Vec::new(),
            interval,
            issued_to: HashMap::new(),
            ttl,
            redeliver_after: None,
            inventory: crate::inventory::Rebuilt::default(),
            rng: seed | 1,
        }
    }

    /// `n` random characters of `[A-Za-z0-9]`.
    pub fn random_alnum(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..n)
            .map(|_| {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                ALPHABET[(self.rng % ALPHABET.len() as u64) as usize] as char
            })
            .collect()
    }

    /// Registers an environment with `token`.
    pub fn add_environment(&mut self, id: &str, token: &str) {
        self.envs.insert(
            id.to_owned(),
            Environment {
                token: token.to_owned(),
                bound: None,
                queue: VecDeque::new(),
                outstanding: Vec::new(),
                delivered: HashSet::new(),
                acked: HashSet::new(),
                signer: None,
            },
        );
    }

    /// The Manager instance that sent a request: the `instance.id` of a
    /// connect body, or that of the connect that issued the session token
    /// a heartbeat or an ack carries.
    pub fn sender(&self, headers: &[(String, String)], body: Option<&Value>) -> Option<String> {
        match body.and_then(|b| b["instance"]["id"].as_str()) {
            Some(id) => Some(id.to_owned()),
            None => self.issued_to.get(bearer(headers)?).cloned(),
        }
    }

    /// The environment of a session token that is still valid.
    fn session_env(&self, headers: &[(String, String)]) -> Result<String, Response> {
        let token =
            bearer(headers).ok_or_else(|| error(401, "session_expired", "no bearer token"))?;
        match self.sessions.get(token) {
            Some(s) if s.expires > SystemTime::now() => Ok(s.env.clone()),
            _ => Err(error(
                401,
                "session_expired",
                "the session is unknown or expired; connect again",
            )),
        }
    }

    /// `POST /api/v2/manager/connect`.
    pub fn connect(&mut self, headers: &[(String, String)], body: &Value) -> Response {
        let token = bearer(headers).unwrap_or("");
        let Some(env_id) = self
            .envs
            .iter()
            .find(|(_, e)| e.token == token)
            .map(|(id, _)| id.clone())
        else {
            return error(
                401,
                "token_invalid",
                "the connect token is unknown, expired or revoked",
            );
        };
        let checks = [
            require(body, "protocolVersion", "a number", Value::is_number),
            require(body, "manager.version", "a string", is_str),
            require(body, "manager.build", "a string", is_str),
            require(body, "manager.capabilities", "a list of strings", |v| {
                v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
            }),
            require(body, "instance.id", "a string", is_str),
            require(body, "instance.podName", "a string", is_str),
            require(body, "instance.namespace", "a string", is_str),
            require(body, "cluster.uid", "a non-empty string", |v| {
                v.as_str().is_some_and(|s| !s.is_empty())
            }),
            require(body, "cluster.kubernetesVersion", "a string", is_str),
        ];
        if let Some(Err(resp)) = checks.into_iter().find(Result::is_err) {
            return resp;
        }
        if body["protocolVersion"] != 2 {
            return error(
                403,
                "protocol_unsupported",
                "only protocol version 2 is supported",
            );
        }
        let uid = body["cluster"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let env = self.envs.get_mut(&env_id).expect("found above");
        match &env.bound {
            Some(bound) if *bound != uid => {
                return error(
                    403,
                    "environment_bound_elsewhere",
                    "this environment is bound to another cluster",
                );
            }
            Some(_) => {}
            None => env.bound = Some(uid),
        }
        let session = self.random_alnum(32);
        let expires = SystemTime::now() + self.ttl;
        if let Some(instance) = body["instance"]["id"].as_str() {
            self.issued_to.insert(session.clone(), instance.to_owned());
        }
        self.sessions.insert(
            session.clone(),
            Session {
                env: env_id.clone(),
                expires,
            },
        );
        let mut resp = json!({
            "environmentId": env_id,
            "managerId": manager_id(&env_id),
            "sessionToken": session,
            "sessionExpiresAt": humantime::format_rfc3339_seconds(expires).to_string(),
        });
        if let Some(i) = self.interval {
            resp["heartbeatIntervalSeconds"] = json!(i);
        }
        Response::json(200, &resp)
    }

    /// Whether commands wait for the environment of the session `headers`
    /// carry; `None` when the session is not valid.
    pub fn has_commands(&self, headers: &[(String, String)]) -> Option<bool> {
        let env = self.session_env(headers).ok()?;
        Some(self.envs.get(&env).is_some_and(|e| !e.queue.is_empty()))
    }

    /// `POST /api/v2/manager/heartbeat`; `held` when the request was held
    /// (`heartbeat.wait.v1`), which the answer says.
    pub fn heartbeat(
        &mut self,
        headers: &[(String, String)],
        body: &Value,
        held: bool,
    ) -> Response {
        let env_id = match self.session_env(headers) {
            Ok(e) => e,
            Err(resp) => return resp,
        };
        let checks = [
            require(body, "managerId", "this session's manager id", |v| {
                v.as_str() == Some(&manager_id(&env_id))
            }),
            require(body, "sequence", "an integer >= 1", |v| {
                v.as_u64().is_some_and(|n| n >= 1)
            }),
            require(body, "sentAt", "a string", is_str),
            require(body, "manager", "an object", Value::is_object),
            require(body, "proxyImage", "a string", is_str),
            require(body, "managedProxyCount", "an integer", is_uint),
            require(body, "deployments", "a list, or absent with a delta", |v| {
                crate::inventory::listed(v, body)
            }),
            require(body, "cluster.uid", "a string", is_str),
            require(body, "pendingAcks", "a list", Value::is_array),
        ];
        if let Some(Err(resp)) = checks.into_iter().find(Result::is_err) {
            return resp;
        }
        let env = self
            .envs
            .get_mut(&env_id)
            .expect("sessions point at environments");
        for ack in body["pendingAcks"].as_array().into_iter().flatten() {
            if let Some(id) = ack["commandId"].as_str()
                && env.acked.insert(id.to_owned())
            {
                self.acks.push(ack.clone());
            }
        }
        let now = SystemTime::now();
        let id_of = |c: &Value| c["id"].as_str().unwrap_or_default().to_owned();
        let acked = &env.acked;
        env.outstanding.retain(|(c, _)| !acked.contains(&id_of(c)));
        let mut commands: Vec<Value> = Vec::new();
        if let Some(after) = self.redeliver_after {
            for (c, sent) in &mut env.outstanding {
                if now.duration_since(*sent).unwrap_or_default() >= after {
                    commands.push(c.clone());
                    *sent = now;
                }
            }
        }
        for c in env.queue.drain(..) {
            env.delivered.insert(id_of(&c));
            if self.redeliver_after.is_some() {
                env.outstanding.push((c.clone(), now));
            }
            commands.push(c);
        }
        self.heartbeats.push(body.clone());
        let mut resp = json!({"commands": commands});
        if let Some(inventory) = self.inventory.take(body) {
            resp["inventory"] = inventory;
        }
        if held {
            resp["held"] = json!(true);
        }
        if let Some(i) = self.interval {
            resp["heartbeatIntervalSeconds"] = json!(i);
        }
        Response::json(200, &resp)
    }

    /// `POST /api/v2/manager/commands/{id}/ack`.
    pub fn ack(&mut self, id: &str, headers: &[(String, String)], body: &Value) -> Response {
        let env_id = match self.session_env(headers) {
            Ok(e) => e,
            Err(resp) => return resp,
        };
        let checks = [
            require(body, "managerId", "this session's manager id", |v| {
                v.as_str() == Some(&manager_id(&env_id))
            }),
            require(body, "commandId", "the id in the path", |v| {
                v.as_str() == Some(id)
            }),
            require(body, "result", "applied or failed", |v| {
                v == "applied" || v == "failed"
            }),
            require(body, "message", "a string", is_str),
            require(body, "completedAt", "a string", is_str),
            require(body, "attempt", "an integer >= 1", |v| {
                v.as_u64().is_some_and(|n| n >= 1)
            }),
            require(body, "resources", "a list", |v| v.is_null() || v.is_array()),
            require(
                body,
                "plan",
                "absent, or a plan (command.plan.v1)",
                crate::plan::valid,
            ),
        ];
        if let Some(Err(resp)) = checks.into_iter().find(Result::is_err) {
            return resp;
        }
        let env = self
            .envs
            .get_mut(&env_id)
            .expect("sessions point at environments");
        if !env.delivered.contains(id) {
            return error(
                404,
                "unknown_command",
                "no such command was delivered to this environment",
            );
        }
        if !env.acked.insert(id.to_owned()) {
            return error(
                409,
                "already_acknowledged",
                "this command was acknowledged before",
            );
        }
        self.acks.push(body.clone());
        Response::json(200, &json!({}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "cluster-1";

    fn auth(token: &str) -> Vec<(String, String)> {
        vec![("authorization".into(), format!("Bearer {token}"))]
    }

    fn connect_body(uid: &str) -> Value {
        json!({"protocolVersion": 2, "manager": {"version": "0.3.0", "build": "b", "capabilities": []},
               "instance": {"id": "i", "podName": "p", "namespace": "n"},
               "cluster": {"uid": uid, "kubernetesVersion": "v1.37.2"}})
    }

    fn heartbeat_body(pending: Value) -> Value {
        json!({"managerId": manager_id("env-a"), "sequence": 1, "sentAt": "t", "manager": {}, "proxyImage": "p",
               "managedProxyCount": 0, "deployments": [], "cluster": {"uid": UID}, "pendingAcks": pending})
    }

    fn connected() -> (State, String) {
        let mut s = State::new(Some(7), Duration::from_secs(60));
        s.add_environment("env-a", "tok-a");
        let resp = s.connect(&auth("tok-a"), &connect_body(UID));
        assert_eq!(resp.status, 200);
        let v: Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(v["heartbeatIntervalSeconds"], 7);
        (s, v["sessionToken"].as_str().unwrap().to_owned())
    }

    fn code(resp: &Response) -> (u16, String) {
        let v: Value = serde_json::from_slice(&resp.body).unwrap();
        (
            resp.status,
            v["error"]["code"].as_str().unwrap_or("").to_owned(),
        )
    }

    #[test]
    fn connect_binds_and_refuses_other_clusters_and_tokens() {
        let (mut s, _) = connected();
        assert_eq!(s.envs["env-a"].bound.as_deref(), Some(UID));
        assert_eq!(
            code(&s.connect(&auth("tok-a"), &connect_body("cluster-2"))),
            (403, "environment_bound_elsewhere".into())
        );
        assert_eq!(
            code(&s.connect(&auth("nope"), &connect_body(UID))),
            (401, "token_invalid".into())
        );
        let mut v1 = connect_body(UID);
        v1["protocolVersion"] = json!(1);
        assert_eq!(
            code(&s.connect(&auth("tok-a"), &v1)),
            (403, "protocol_unsupported".into())
        );
        let mut missing = connect_body(UID);
        missing["instance"]
            .as_object_mut()
            .unwrap()
            .remove("podName");
        let resp = s.connect(&auth("tok-a"), &missing);
        assert_eq!(code(&resp), (400, "invalid_request".into()));
        assert!(String::from_utf8_lossy(&resp.body).contains("instance.podName"));
    }

    #[test]
    fn heartbeat_drains_commands_once_and_acks_are_exactly_once() {
        let (mut s, session) = connected();
        s.envs
            .get_mut("env-a")
            .unwrap()
            .queue
            .push_back(json!({"id": "c1", "class": "deploy"}));
        let first: Value = serde_json::from_slice(
            &s.heartbeat(&auth(&session), &heartbeat_body(json!([])), false)
                .body,
        )
        .unwrap();
        assert_eq!(first["commands"].as_array().unwrap().len(), 1);
        let second: Value = serde_json::from_slice(
            &s.heartbeat(&auth(&session), &heartbeat_body(json!([])), false)
                .body,
        )
        .unwrap();
        assert_eq!(second["commands"], json!([]));
        let ack = json!({"managerId": manager_id("env-a"), "commandId": "c1", "result": "applied", "message": "",
                         "completedAt": "t", "attempt": 1, "resources": []});
        assert_eq!(s.ack("c1", &auth(&session), &ack).status, 200);
        assert_eq!(
            code(&s.ack("c1", &auth(&session), &ack)),
            (409, "already_acknowledged".into())
        );
        let mut unknown = ack.clone();
        unknown["commandId"] = json!("c9");
        assert_eq!(
            code(&s.ack("c9", &auth(&session), &unknown)),
            (404, "unknown_command".into())
        );
        assert_eq!(s.acks.len(), 1);
    }

    #[test]
    fn pending_acks_count_as_acks_and_sessions_expire() {
        let (mut s, session) = connected();
        let pending = json!([{"commandId": "c2", "result": "failed"}, {"commandId": "c2", "result": "failed"}]);
        assert_eq!(
            s.heartbeat(&auth(&session), &heartbeat_body(pending), false)
                .status,
            200
        );
        assert_eq!(s.acks.len(), 1, "a duplicate pending ack is recorded once");
        let mut bad = heartbeat_body(json!([]));
        bad["sequence"] = json!(0);
        assert_eq!(
            code(&s.heartbeat(&auth(&session), &bad, false)),
            (400, "invalid_request".into())
        );
        s.sessions.clear();
        assert_eq!(
            code(&s.heartbeat(&auth(&session), &heartbeat_body(json!([])), false)),
            (401, "session_expired".into())
        );
    }

    #[test]
    fn unacknowledged_commands_are_sent_again_first_and_acknowledged_ones_never() {
        let (mut s, session) = connected();
        let ids = |resp: &Response| -> Vec<String> {
            let v: Value = serde_json::from_slice(&resp.body).unwrap();
            v["commands"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_owned())
                .collect()
        };
        let beat = |s: &mut State, pending: Value| {
            ids(&s.heartbeat(&auth(&session), &heartbeat_body(pending), false))
        };
        // Off by default: delivered once.
        s.envs
            .get_mut("env-a")
            .unwrap()
            .enqueue("env-a", json!({"id": "c0"}));
        assert_eq!(beat(&mut s, json!([])), ["c0"]);
        assert!(beat(&mut s, json!([])).is_empty());
        s.redeliver_after = Some(Duration::ZERO);
        for id in ["c1", "c2"] {
            s.envs
                .get_mut("env-a")
                .unwrap()
                .enqueue("env-a", json!({"id": id}));
        }
        assert_eq!(beat(&mut s, json!([])), ["c1", "c2"]);
        s.envs
            .get_mut("env-a")
            .unwrap()
            .enqueue("env-a", json!({"id": "c3"}));
        // c1 acknowledged (as a pending ack): c2 again, before the new c3.
        assert_eq!(
            beat(&mut s, json!([{"commandId": "c1", "result": "applied"}])),
            ["c2", "c3"]
        );
        s.redeliver_after = Some(Duration::from_secs(3600));
        assert!(beat(&mut s, json!([])).is_empty(), "not before its time");
    }

    #[test]
    fn manager_ids_are_stable() {
        assert_eq!(manager_id("env-a"), manager_id("env-a"));
        assert_ne!(manager_id("env-a"), manager_id("env-b"));
        assert!(manager_id("x").starts_with("mgr-") && manager_id("x").len() == 12);
    }
}
