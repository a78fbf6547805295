#!/usr/bin/env bash
# The sandbox on a node (`bash tests/sandbox.sh --node [--once]`): the Manager
# as users run it, a pod from our image (tests/image/build-image.sh) started
# by a kubelet from manifests/ (a kustomize overlay sets only the image, the
# CP URL and CA, the Proxy image, a 3 s heartbeat interval and the connect
# token), on the test bed's node (testbed.sh start DIR --node). It shows the
# pod and its probes, plays the demo scenario, then a self-upgrade: the
# rolling update, the lease changing hands, heartbeats going on; then a
# self-upgrade to an image whose process exits at once, rolled back by the
# old pod after NEXO_SELF_UPGRADE_DEADLINE (30 s here), which keeps leading.
set -euo pipefail
cd "$(dirname "$0")/.."

once=false
inside=false
for arg in "$@"; do
  case $arg in
    --once) once=true ;;
    --inside) inside=true ;;
  esac
done
testbed=tests/testbed/testbed.sh
say() { printf '\033[1m%s\033[0m %s\n' "$(date +%H:%M:%S)" "$*"; }

if ! $inside; then
  [ "$(id -u)" = 0 ] || { echo "sandbox: --node needs root (network namespace, containerd)" >&2; exit 1; }
  work=$(mktemp -d -t nexo-sandbox.XXXXXX)
  tb_dir=$work/testbed
  child=
  cleanup() {
    [ -z "$child" ] || { kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; }
    bash "$testbed" stop "$tb_dir"
    rm -rf "$work"
  }
  trap cleanup EXIT
  trap 'echo; say "stopping"; exit 0' INT TERM
  say "building (cached after the first run): the test bed with a node, the static binary, the images"
  bash "$testbed" build --node
  cargo build --release --locked --bin nexo-cpsim -p nexo-cpsim 2>&1 | tail -n 1
  bin=$(bash tests/build-static.sh)
  bash tests/image/build-image.sh "$bin" "$work/images" >"$work/images.env"
  bash "$testbed" start "$tb_dir" --node $$
  for archive in manager manager-b manager-crash proxy; do
    bash "$testbed" import "$tb_dir" "$work/images/$archive.oci.tar" 2>/dev/null
  done
  netns=$(sed -n 's/^NETNS=//p' "$tb_dir/env")
  say "the node is up; everything below runs in network namespace $netns"
  NEXO_SANDBOX_WORK=$work ip netns exec "$netns" bash "$0" --inside "$@" &
  child=$!
  wait "$child"
  child=
  exit 0
fi

work=${NEXO_SANDBOX_WORK:?}
tb_dir=$work/testbed
# shellcheck disable=SC1091
. "$tb_dir/env"
image() { sed -n "s/^$1=//p" "$work/images.env"; }
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }
ns=nexo-system
# The namespace the Manager manages (README.md, "Adding a managed namespace").
app=nexo-proxies
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done' EXIT

say "starting the Control Plane simulator on $NODE_IP"
target/release/nexo-cpsim --addr "$NODE_IP:0" --env env-sandbox --ca-out "$work/cp-ca.pem" \
  --keys-out "$work/command-keys" --redeliver-after 30 >"$work/sim.out" 2>"$work/sim.err" &
pids+=($!)
for _ in $(seq 1 100); do grep -q '^ready$' "$work/sim.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready$' "$work/sim.out" || { cat "$work/sim.err" >&2; echo "sandbox: the simulator did not start" >&2; exit 1; }
cp_url=$(sed -n 's/^url=//p' "$work/sim.out")
token=$(sed -n 's/^token.env-sandbox=//p' "$work/sim.out")

say "installing manifests/ with the image $(image manager)"
overlay=$work/overlay
mkdir -p "$overlay"
cp -r manifests "$overlay/base"
cp "$work/cp-ca.pem" "$overlay/ca.crt"
repo=$(image manager); digest=${repo#*@}; repo=${repo%@*}
cat >"$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [base/crds, base/namespace.yaml, base, keys.yaml, token.yaml]
images:
  - {name: registry.example.com/nexo/manager, newName: $repo, digest: $digest}
configMapGenerator:
  - {name: nexo-cp-ca, namespace: $ns, files: [ca.crt]}
generatorOptions: {disableNameSuffixHash: true}
patches:
  - path: patch.yaml
YAML
cat >"$overlay/patch.yaml" <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: nexo-manager, namespace: $ns}
spec:
  template:
    spec:
      containers:
        - name: manager
          env:
            - {name: NEXO_CONTROL_PLANE_URL, value: "$cp_url"}
            - {name: NEXO_CONTROL_PLANE_CA_FILE, value: /var/run/nexo-cp-ca/ca.crt}
            - {name: NEXO_PROXY_IMAGE, value: "$(image proxy)"}
            - {name: NEXO_HEARTBEAT_INTERVAL, value: 3s}
            - {name: NEXO_SELF_UPGRADE_DEADLINE, value: 30s}
            - {name: NEXO_NAMESPACES, value: "$app"}
          volumeMounts:
            - {name: cp-ca, mountPath: /var/run/nexo-cp-ca, readOnly: true}
      volumes:
        - {name: cp-ca, configMap: {name: nexo-cp-ca}}
YAML
# The connect-token Secret, made once beside the base (README.md).
cat >"$overlay/token.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: nexo-connect-token, namespace: $ns}
stringData: {connect-token: "$token"}
YAML
# The simulator signs every command: the pod verifies with its key.
cat >"$overlay/keys.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: nexo-command-keys, namespace: $ns}
stringData: {command-keys: "$(cat "$work/command-keys")"}
YAML
k apply --server-side -k "$overlay" >/dev/null
say "adding the managed namespace $app (the Manager reads it, its executor nexo-executor writes in it)"
bash tests/managed-namespace.sh "$KUBECTL" "$KUBECONFIG" "$ns" "$app"
k -n "$ns" rollout status deployment/nexo-manager --timeout=120s >/dev/null

pods() { k -n "$ns" get pods -l app.kubernetes.io/name=nexo-manager -o wide; }
probe() { # pod-ip path
  curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$1:8080$2" || true
}
show_pod() {
  local name ip uid
  name=$(k -n "$ns" get pods -l app.kubernetes.io/name=nexo-manager --field-selector status.phase=Running \
    -o jsonpath='{.items[-1:].metadata.name}')
  ip=$(k -n "$ns" get pod "$name" -o jsonpath='{.status.podIP}')
  say "pod $name ($ip): image $(k -n "$ns" get pod "$name" -o jsonpath='{.spec.containers[0].image}')"
  say "  probes: /healthz $(probe "$ip" /healthz), /readyz $(probe "$ip" /readyz) (curl from the node)"
  say "  lease holder: $(k -n "$ns" get lease nexo-manager -o jsonpath='{.spec.holderIdentity}')"
}
pods
show_pod

send() { # id class payload
  curl -fsS --cacert "$work/cp-ca.pem" -X POST "$cp_url/_sim/commands?env=env-sandbox" \
    -d "{\"id\": \"$1\", \"class\": \"$2\", \"issuedAt\": \"$(date -u +%FT%TZ)\", \"payload\": $3}"
  say "control plane: sent $2 $1"
  for _ in $(seq 1 600); do
    if curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/acks" | grep -q "\"commandId\":\"$1\""; then
      result=$(curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/acks" | python3 -c "import json,sys; a=[x for x in json.load(sys.stdin) if x['commandId']=='$1'][0]; print(a['result'] + ': ' + a['message'])")
      say "control plane: ack $1 -> $result"
      return 0
    fi
    sleep 0.1
  done
  echo "sandbox: no ack for $1" >&2; pods >&2; exit 1
}
proxy() { echo "{\"apiVersion\": \"nexo.io/v1alpha1\", \"kind\": \"NexoProxy\", \"metadata\": {\"name\": \"$1\"}, \"spec\": {\"image\": \"$(image proxy)\", \"replicas\": 1, \"mongodb\": {\"secretRef\": {\"name\": \"$1-db\"}}}}"; }
legacy() {
  cat <<JSON
{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "$1"}, "spec": {"replicas": 1,
 "selector": {"matchLabels": {"app": "$1"}}, "template": {"metadata": {"labels": {"app": "$1"}}, "spec": {
 "automountServiceAccountToken": false,
 "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
 "containers": [{"name": "proxy", "image": "$(image proxy)", "ports": [{"containerPort": 27017}],
   "readinessProbe": {"tcpSocket": {"port": 27017}, "periodSeconds": 1},
   "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}}}]}}}}
JSON
}
send deploy-orders deploy "{\"deployment\": {\"name\": \"orders\", \"namespace\": \"$app\"}, \"format\": \"crd\", \"manifests\": [$(proxy orders)]}"
send deploy-billing deploy "{\"deployment\": {\"name\": \"billing\", \"namespace\": \"$app\"}, \"format\": \"legacy\", \"manifests\": [$(legacy billing)]}"
k -n "$app" rollout status deployment/billing --timeout=60s >/dev/null
say "the legacy deployment's pod is Ready:"
k -n "$app" get pods -l app=billing -o wide

say "self-upgrade to $(image manager_b) (same binary, another digest)"
before=$(curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/heartbeats" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
# The bundle it runs (Cargo.toml's version, as manifests/ says): no downgrade.
bundle=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
send upgrade-b upgrade "{\"bundleVersion\": \"$bundle\", \"managerImage\": \"$(image manager_b)\"}"
last=""
for _ in $(seq 1 240); do
  now=$(k -n "$ns" get pods -l app.kubernetes.io/name=nexo-manager --no-headers \
    -o custom-columns=NAME:.metadata.name,READY:.status.containerStatuses[0].ready,PHASE:.status.phase,DELETING:.metadata.deletionTimestamp 2>/dev/null \
    | awk '{printf "%s ready=%s %s%s; ", $1, $2, $3, ($4 == "<none>" ? "" : " terminating")}')
  if [ "$now" != "$last" ]; then say "  pods: $now"; last=$now; fi
  if k -n "$ns" rollout status deployment/nexo-manager --timeout=1s >/dev/null 2>&1 \
     && [ "$(k -n "$ns" get pods -l app.kubernetes.io/name=nexo-manager --no-headers | wc -l)" = 1 ]; then
    break
  fi
  sleep 0.5
done
sleep 4
show_pod
say "  what the new pod says:"
k -n "$ns" logs "$(k -n "$ns" get pods -l app.kubernetes.io/name=nexo-manager -o jsonpath='{.items[-1:].metadata.name}')" \
  | grep -E 'starting|leading|connected|state read' | sed 's/^[^ ]* [A-Z]* *nexo_manager::[a-z_]*: /    /' || true
after=$(curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/heartbeats" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
say "heartbeats during the upgrade: $((after - before)); the longest gap between two:"
curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/heartbeats" | python3 -c '
import json, sys, datetime
t = [datetime.datetime.fromisoformat(h["sentAt"].replace("Z", "+00:00")) for h in json.load(sys.stdin)]
gaps = [(b - a).total_seconds() for a, b in zip(t, t[1:])]
print("  %.0f s (interval 3 s)" % max(gaps))'
self_upgrade() { # what the last heartbeat says of the last upgrade
  curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/heartbeats" | python3 -c '
import json, sys
s = json.load(sys.stdin)[-1].get("selfUpgrade") or {}
print("%s %s %s->%s %s" % (s.get("commandId"), s.get("phase"), s.get("from"), s.get("to"), s.get("reason", "")))'
}
say "the heartbeat's selfUpgrade: $(self_upgrade)"

leader=$(k -n "$ns" get lease nexo-manager -o jsonpath='{.spec.holderIdentity}')
say "self-upgrade to $(image manager_crash): its process exits at once"
send upgrade-crash upgrade "{\"bundleVersion\": \"$bundle\", \"managerImage\": \"$(image manager_crash)\"}"
last=""
for _ in $(seq 1 240); do
  now=$(k -n "$ns" get pods -l app.kubernetes.io/name=nexo-manager --no-headers \
    -o custom-columns=NAME:.metadata.name,READY:.status.containerStatuses[0].ready,RESTARTS:.status.containerStatuses[0].restartCount,DELETING:.metadata.deletionTimestamp 2>/dev/null \
    | awk '{printf "%s ready=%s restarts=%s%s; ", $1, $2, $3, ($4 == "<none>" ? "" : " terminating")}')
  if [ "$now" != "$last" ]; then say "  pods: $now"; last=$now; fi
  self_upgrade | grep -q '^upgrade-crash rolledBack' && break
  sleep 0.5
done
self_upgrade | grep -q '^upgrade-crash rolledBack' || { echo "sandbox: the crashing upgrade was never rolled back" >&2; pods >&2; exit 1; }
say "the heartbeat's selfUpgrade: $(self_upgrade)"
k -n "$ns" rollout status deployment/nexo-manager --timeout=90s >/dev/null
say "the Deployment runs $(k -n "$ns" get deployment nexo-manager -o jsonpath='{.spec.template.spec.containers[0].image}') again"
say "lease holder before: $leader, now: $(k -n "$ns" get lease nexo-manager -o jsonpath='{.spec.holderIdentity}')"
pods

if $once; then
  say "done (--once)"
  exit 0
fi
say "heartbeating; Ctrl-C stops everything"
while true; do sleep 3600; done
