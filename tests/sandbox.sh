#!/usr/bin/env bash
# The sandbox: Nexo Manager against a real local Kubernetes API and the CP
# simulator, through a demo scenario, with a readable timeline.
#
#   bash tests/sandbox.sh           run the scenario, then keep heartbeating until Ctrl-C
#   bash tests/sandbox.sh --once    run the scenario and stop (used by tests/run.sh)
#   bash tests/sandbox.sh --node    the same on the test bed's node: the Manager as a pod
#                                   from our image, its probes, and a self-upgrade
#
# It starts the test bed (tests/testbed/testbed.sh, built once and cached), or
# uses the cluster of $KUBECONFIG when NEXO_SANDBOX_USE_KUBECONFIG=1 (it then
# needs cluster-admin to install manifests/). It installs manifests/, runs the
# Manager as its ServiceAccount under the shipped RBAC, and plays: two crd
# deployments, one legacy deployment, the plan of a rollout (command.plan.v1),
# the rollout, which ends failed (status.v1) and is rolled back (rollback.v1),
# two kubectl edits (one drift reported, one corrected: drift.v1), the
# Events, an uninstall, and heartbeats that carry only what changed once the
# CP confirms what it holds (inventory.delta.v1). Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
# What a fresh machine lacks (Debian packages, rustup targets).
bash tests/install.sh

once=false
node=false
for arg in "$@"; do
  case $arg in
    --once) once=true ;;
    --node) node=true ;;
    --inside) ;;
    *) echo "usage: sandbox.sh [--once] [--node]" >&2; exit 2 ;;
  esac
done
testbed=tests/testbed/testbed.sh
if $node; then
  # The node mode lives in its own script: it runs inside the test bed's
  # network namespace.
  exec bash tests/sandbox-node.sh "$@"
fi
work=$(mktemp -d -t nexo-sandbox.XXXXXX)
pids=()
tb_dir=""

say() { printf '\033[1m%s\033[0m %s\n' "$(date +%H:%M:%S)" "$*"; }
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$tb_dir" ] && bash "$testbed" stop "$tb_dir"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo; say "stopping"; exit 0' INT TERM

say "building (cached after the first run)"
bash "$testbed" build
cargo build --release --locked --bin nexo-manager -p nexo-manager --bin nexo-cpsim -p nexo-cpsim 2>&1 | tail -n 1
kubectl=$(bash "$testbed" bin)/kubectl

if [ "${NEXO_SANDBOX_USE_KUBECONFIG:-}" = 1 ]; then
  kubeconfig=${KUBECONFIG:?NEXO_SANDBOX_USE_KUBECONFIG=1 needs KUBECONFIG}
  say "using the cluster of $kubeconfig"
else
  tb_dir=$work/testbed
  bash "$testbed" start "$tb_dir" $$
  kubeconfig=$tb_dir/admin.kubeconfig
fi
k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }

say "installing manifests/crds, manifests/namespace.yaml and manifests/ (ServiceAccount, RBAC, Deployment, metrics Service)"
k apply -k manifests/crds >/dev/null
k apply -f manifests/namespace.yaml >/dev/null
k apply -k manifests/ >/dev/null
ns=nexo-system
# The namespace the Manager manages, added as README.md "Adding a managed
# namespace" says: its own namespace has no executor, so no command can
# write there.
app=nexo-proxies
say "adding the managed namespace $app (the Manager reads it, its executor nexo-executor writes in it)"
bash tests/managed-namespace.sh "$kubectl" "$kubeconfig" "$ns" "$app"

say "starting the Control Plane simulator (it signs every command with a key made for this run, and sends a command not acknowledged in 30 s again)"
target/release/nexo-cpsim --env env-sandbox --ca-out "$work/cp-ca.pem" --keys-out "$work/command-keys" \
  --redeliver-after 30 >"$work/sim.out" 2>"$work/sim.err" &
pids+=($!)
for _ in $(seq 1 100); do grep -q '^ready$' "$work/sim.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready$' "$work/sim.out" || { cat "$work/sim.err" >&2; echo "sandbox: the simulator did not start" >&2; exit 1; }
cp_url=$(sed -n 's/^url=//p' "$work/sim.out")
sed -n 's/^token.env-sandbox=//p' "$work/sim.out" >"$work/connect-token"

token=$(k -n "$ns" create token nexo-manager --duration 1h)
server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}')
ca_data=$(k config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
if [ -n "$ca_data" ]; then
  echo "$ca_data" | base64 -d >"$work/kube-ca.pem"
else
  cp "$(k config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')" "$work/kube-ca.pem"
fi
cat >"$work/manager.kubeconfig" <<KC
{"apiVersion": "v1", "kind": "Config",
 "clusters": [{"name": "c", "cluster": {"server": "$server", "certificate-authority": "$work/kube-ca.pem"}}],
 "users": [{"name": "nexo-manager", "user": {"token": "$token"}}],
 "contexts": [{"name": "c", "context": {"cluster": "c", "user": "nexo-manager"}}],
 "current-context": "c"}
KC

say "starting nexo-manager as ServiceAccount $ns/nexo-manager"
env -i PATH="$PATH" \
  NEXO_CONTROL_PLANE_URL="$cp_url" NEXO_CONTROL_PLANE_CA_FILE="$work/cp-ca.pem" \
  NEXO_CONNECT_TOKEN_FILE="$work/connect-token" NEXO_PROXY_IMAGE=registry.example.com/nexo/proxy:1.4.2 \
  NEXO_HEARTBEAT_INTERVAL=10s NEXO_PROGRESS_DEADLINE=20s NEXO_DRIFT_INTERVAL=10s NEXO_LISTEN_ADDR=127.0.0.1:0 NEXO_COMMAND_KEYS_FILE="$work/command-keys" \
  NEXO_NAMESPACES="$app" POD_NAMESPACE="$ns" POD_NAME=nexo-manager-sandbox POD_UID="sandbox-$$" \
  KUBECONFIG="$work/manager.kubeconfig" RUST_LOG=info \
  target/release/nexo-manager 2>"$work/manager.log" &
manager=$!
pids+=($manager)

# The timeline: what the Manager says, as it says it.
tail --pid="$manager" -n +1 -F "$work/manager.log" 2>/dev/null | grep --line-buffered -E 'command keys|connected|executing|applied|failed|ack|leading|interval|drift|rollback|is (available|degraded)' \
  | sed -u -E 's/^[^ ]* [A-Z]* *nexo_manager::[a-z_:]+: /  manager: /' &

send() { # id class payload
  local sent_ns
  sent_ns=$(date +%s%N)
  curl -fsS --cacert "$work/cp-ca.pem" -X POST "$cp_url/_sim/commands?env=env-sandbox" \
    -d "{\"id\": \"$1\", \"class\": \"$2\", \"issuedAt\": \"$(date -u +%FT%TZ)\", \"payload\": $3}"
  say "control plane: sent $2 $1"
  for _ in $(seq 1 300); do
    if curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/acks" | grep -q "\"commandId\":\"$1\""; then
      result=$(curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/acks" | python3 -c "import json,sys; a=[x for x in json.load(sys.stdin) if x['commandId']=='$1'][0]; print(a['result'] + ': ' + a['message'])")
      say "control plane: ack $1 after $((($(date +%s%N) - sent_ns) / 1000000)) ms -> $result"
      return 0
    fi
    kill -0 "$manager" 2>/dev/null || { echo "sandbox: nexo-manager exited" >&2; cat "$work/manager.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "sandbox: no ack for $1" >&2; exit 1
}
proxy() { echo "{\"apiVersion\": \"nexo.io/v1alpha1\", \"kind\": \"NexoProxy\", \"metadata\": {\"name\": \"$1\"}, \"spec\": {\"image\": \"registry.example.com/nexo/proxy:1.4.2\", \"replicas\": 2, \"mongodb\": {\"secretRef\": {\"name\": \"$1-db\"}}}}"; }
config() { echo "{\"apiVersion\": \"v1\", \"kind\": \"ConfigMap\", \"metadata\": {\"name\": \"$1-config\"}, \"data\": {\"listen\": \"27017\"}}"; }

# First a Control Plane that never holds a heartbeat: a command waits for
# the next one (the interval is 10 s).
say "control plane: never holding heartbeats (a command waits for the next one)"
send deploy-orders deploy "{\"deployment\": {\"name\": \"orders\", \"namespace\": \"$app\"}, \"format\": \"crd\", \"manifests\": [$(proxy orders), $(config orders)], \"drift\": {\"mode\": \"enforce\"}}"
# Then one that holds them (heartbeat.wait.v1): a command is answered to the
# held heartbeat at once.
curl -fsS --cacert "$work/cp-ca.pem" -X POST "$cp_url/_sim/hold?on=true"
say "control plane: holding heartbeats now (a command goes out at once, to the held one)"
for _ in $(seq 1 150); do
  curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/log" | grep 'manager/heartbeat' | tail -n 1 | grep -q '(pending)' && break
  sleep 0.1
done
send deploy-catalog deploy "{\"deployment\": {\"name\": \"catalog\", \"namespace\": \"$app\"}, \"format\": \"crd\", \"manifests\": [$(proxy catalog), $(config catalog)], \"drift\": {\"mode\": \"report\"}}"
# $app enforces the restricted Pod Security profile, and the Manager holds a
# legacy pod template to it before anything is applied.
send deploy-billing deploy "{\"deployment\": {\"name\": \"billing\", \"namespace\": \"$app\"}, \"format\": \"legacy\", \"manifests\": [{\"apiVersion\": \"apps/v1\", \"kind\": \"Deployment\", \"metadata\": {\"name\": \"billing\"}, \"spec\": {\"selector\": {\"matchLabels\": {\"app\": \"billing\"}}, \"template\": {\"metadata\": {\"labels\": {\"app\": \"billing\"}}, \"spec\": {\"securityContext\": {\"runAsNonRoot\": true, \"seccompProfile\": {\"type\": \"RuntimeDefault\"}}, \"containers\": [{\"name\": \"proxy\", \"image\": \"registry.example.com/nexo/proxy:1.3.0\", \"securityContext\": {\"allowPrivilegeEscalation\": false, \"capabilities\": {\"drop\": [\"ALL\"]}}}]}}}}]}"
# Before the rollout, its plan (command.plan.v1): what it would change, with
# nothing written.
send plan-rollout-1.4.3 plan '{"class": "rollout", "payload": {"imageTag": "1.4.3"}}'
say "the plan, as the ack carries it:"
curl -fsS --cacert "$work/cp-ca.pem" "$cp_url/_sim/acks" | python3 -c '
import json, sys
plan = [a for a in json.load(sys.stdin) if a["commandId"] == "plan-rollout-1.4.3"][0]["plan"]
print("  would succeed: %s" % plan["wouldSucceed"])
for o in plan["objects"]:
    print("  %-10s %-10s %-11s %s" % (o["kind"], o["name"], o["action"], " ".join(o["fields"])))'
say "orders still runs $(k -n "$app" get nexoproxy orders -o jsonpath='{.spec.image}')"
send rollout-1.4.3 rollout '{"imageTag": "1.4.3", "onFailure": "rollback"}'
# No operator runs here, so no NexoProxy ever reports its pods ready: the
# rollout's image cannot start, and NEXO_PROGRESS_DEADLINE (20 s) after it
# the proxies' phase is failed (status.v1), a Warning Event about each; the
# rollout said onFailure rollback (rollback.v1): each proxy's deploy is
# restored.
say "waiting for the rollout's progress deadline (20 s): nothing reports its pods ready"
for _ in $(seq 1 400); do
  grep -q 'a failed command rolled back failedCommand=rollout-1.4.3 namespace=[a-z0-9-]* deployment=orders ' "$work/manager.log" && break
  sleep 0.1
done
grep -q 'a failed command rolled back failedCommand=rollout-1.4.3 namespace=[a-z0-9-]* deployment=orders to=deploy-orders$' "$work/manager.log" \
  || { echo "sandbox: the failed rollout was never rolled back" >&2; exit 1; }
say "orders runs $(k -n "$app" get nexoproxy orders -o jsonpath='{.spec.image}') again"
# Someone edits what the Manager applied (kubectl edit, as its field manager
# records it): catalog's drift is reported, orders' corrected (mode enforce).
say "kubectl edit: listen 27017 -> 27018 in orders-config and catalog-config"
for d in orders catalog; do
  k -n "$app" patch configmap "$d-config" --field-manager=kubectl-edit --type=merge -p '{"data": {"listen": "27018"}}' >/dev/null
done
# The Manager's log lines (a constant message, the values as fields).
enforced="drift enforced kind=ConfigMap namespace=$app name=orders-config deployment=orders action=corrected "
reported="drift found kind=ConfigMap namespace=$app name=catalog-config deployment=catalog "
for _ in $(seq 1 400); do
  grep -q "$enforced" "$work/manager.log" && grep -q "$reported" "$work/manager.log" && break
  sleep 0.1
done
grep -q "$enforced" "$work/manager.log" || { echo "sandbox: the edit of orders-config was never corrected" >&2; exit 1; }
grep -q "$reported" "$work/manager.log" || { echo "sandbox: the edit of catalog-config was never reported" >&2; exit 1; }
say "orders-config listen is $(k -n "$app" get configmap orders-config -o jsonpath='{.data.listen}') again; catalog-config's stays $(k -n "$app" get configmap catalog-config -o jsonpath='{.data.listen}') (reported)"
say "the Events the Manager wrote about what it did:"
k -n "$app" get events.v1.events.k8s.io -o json | python3 -c '
import json, sys
items = [e for e in json.load(sys.stdin)["items"] if e.get("reportingController") == "nexo.io/manager"]
for e in sorted(items, key=lambda e: e.get("eventTime") or ""):
    print("  %-8s %-15s %-14s %-10s %s x%d" % (e["type"], e["reason"], e["action"], e["regarding"]["kind"] + "/" + e["regarding"]["name"], e.get("note", "")[:60], e.get("series", {}).get("count", 1)))'
send uninstall-catalog uninstall "{\"deployment\": {\"name\": \"catalog\", \"namespace\": \"$app\"}}"
# The garbage collector notices new CRDs on its next discovery pass (about 30 s).
say "waiting for the garbage collector to remove catalog's runtime ConfigMap"
for _ in $(seq 1 600); do
  k -n "$app" get configmap catalog-config >/dev/null 2>&1 || break
  sleep 0.1
done
sleep 2

# Inventory deltas (inventory.delta.v1): a CP that confirms what it holds
# gets what changed, not the whole inventory.
sim() { curl -fsS --cacert "$work/cp-ca.pem" "$@"; }
beats() { sim "$cp_url/_sim/heartbeats" | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
wait_beats() { # n
  local until=$(($(beats) + $1))
  for _ in $(seq 1 600); do [ "$(beats)" -ge "$until" ] && return 0; sleep 0.1; done
  echo "sandbox: no heartbeat for 60 s" >&2; exit 1
}
last_inventory() {
  sim "$cp_url/_sim/heartbeats" | python3 -c '
import json, sys
hb = json.load(sys.stdin)[-1]
i = hb["inventory"]
size = len(json.dumps(hb, separators=(",", ":")))
if i.get("full"):
    print("the full form, revision %d: %d deployments, %d bytes" % (i["revision"], len(hb["deployments"]), size))
else:
    print("a delta, revision %d on base %d: changed %s, removed %s, %d bytes" % (i["revision"], i["base"], [c["name"] for c in i["changed"]], [r["name"] for r in i["removed"]], size))'
}
say "control plane: confirming inventories now (inventory.delta.v1); until now each heartbeat carried $(last_inventory)"
sim -X POST "$cp_url/_sim/inventory?confirm=always"
# orders is failing again (its rollout was rolled back to an image no
# operator runs here), so its status may change once more before all rests.
for _ in $(seq 1 600); do last_inventory | grep -q "changed \[\], removed \[\]" && break; sleep 0.1; done
say "at rest, the heartbeat carries $(last_inventory)"
k -n "$app" scale deployment billing --replicas=2 >/dev/null
say "kubectl scale deployment billing --replicas=2"
for _ in $(seq 1 300); do last_inventory | grep -q "changed \['billing'\]" && break; sleep 0.1; done
say "the next heartbeat carries $(last_inventory)"
say "control plane: loses two confirmations, then asks for the full form"
sim -X POST "$cp_url/_sim/inventory?lose=2"
wait_beats 2
sim -X POST "$cp_url/_sim/inventory?resync=true"
wait_beats 2
sim "$cp_url/_sim/inventory" | python3 -c '
import json, sys
i = json.load(sys.stdin)
print("  the simulator applied %d deltas; %d full forms compared with the revision rebuilt from deltas; mismatches: %s" % (i["deltas"], i["compared"], i["mismatches"] or "none"))
sys.exit(1 if i["mismatches"] or i["compared"] == 0 else 0)' \
  || { echo "sandbox: the inventory rebuilt from deltas is not the full form" >&2; exit 1; }

say "the last heartbeat reports (its inventory as the simulator rebuilt it):"
sim "$cp_url/_sim/inventory" >"$work/inventory.json"
sim "$cp_url/_sim/heartbeats" | python3 -c '
import json, sys
hb = json.load(sys.stdin)[-1]
rebuilt = json.load(open(sys.argv[1]))
print("  sequence %d, %d managed deployments:" % (hb["sequence"], hb["managedProxyCount"]))
for d in rebuilt["deployments"]:
    st = d.get("status", {})
    print("    %-10s %-10s %-10s replicas=%s image=%s phase=%s (%s)" % (d["namespace"], d["name"], d["kind"], d["replicas"], d.get("image"), st.get("phase"), st.get("message", "")))
for d in hb.get("drift", []):
    for o in d["objects"]:
        print("    drift: %s %s %s %s %s" % (d["name"], o["kind"], o["name"], o.get("fields", "gone"), o["action"]))' "$work/inventory.json"
say "the objects in $app:"
k -n "$app" get nexoproxies,deployments,configmaps -l app.kubernetes.io/managed-by=nexo-manager -L nexo.io/deployment
rss=$(grep VmHWM "/proc/$manager/status" | awk '{print $2 " " $3}')
say "nexo-manager peak RSS: $rss"

if $once; then
  say "done (--once)"
  exit 0
fi
say "heartbeating; Ctrl-C stops everything"
wait "$manager"
