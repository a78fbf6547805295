#!/usr/bin/env bash
# The do-it-yourself alternative the benchmarks compare the Manager with:
# what a user would write without an agent. A shell loop that lists the
# inventory with kubectl, shapes JSON with jq, talks to the Control Plane
# with curl (connect, heartbeat, ack) and applies deploy commands with
# `kubectl apply --server-side`. It does the benchmark's work and no more:
# no ownership guard, no dry run, no ledger, no ack retries, no lease.
#
# Environment (all required):
#   CP_URL CP_CA TOKEN_FILE   the Control Plane, its CA, the connect token file
#   OWNER_ID NAMESPACE        whose objects to report, and where
#   KUBECTL KUBECONFIG        the kubectl to run and its cluster
#   PROXY_IMAGE               reported as proxyImage
#   INTERVAL CYCLES           seconds between cycles; stop after CYCLES (0: never)
#
# Prints "cycle N" on stdout after each heartbeat cycle (the benchmark
# samples /proc there); errors go to stderr.
set -euo pipefail
for v in CP_URL CP_CA TOKEN_FILE OWNER_ID NAMESPACE KUBECTL KUBECONFIG PROXY_IMAGE INTERVAL CYCLES; do
  [ -n "${!v:-}" ] || { echo "diy-agent: $v is not set" >&2; exit 2; }
done
export KUBECONFIG
work=$(mktemp -d -t diy-agent.XXXXXX)
trap 'rm -rf "$work"' EXIT
caps='["heartbeat.inventory.v1","command.deploy.crd"]'

post() { # path bearer body_file answer_file; prints the HTTP status
  curl -sS --max-time 30 --cacert "$CP_CA" -o "$4" -w '%{http_code}' \
    -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
    -H 'User-Agent: diy-agent/1' --data-binary @"$3" "$CP_URL$1"
}

uid=$("$KUBECTL" get namespace kube-system -o jsonpath='{.metadata.uid}')
version=$("$KUBECTL" version -o json | jq -r .serverVersion.gitVersion)
jq -n --arg uid "$uid" --arg v "$version" --arg ns "$NAMESPACE" --argjson caps "$caps" \
  '{protocolVersion: 2, manager: {version: "0.0.0-diy", build: "diy", capabilities: $caps},
    instance: {id: "diy-agent", podName: "diy-agent", namespace: $ns},
    cluster: {uid: $uid, kubernetesVersion: $v}}' >"$work/connect.json"
status=$(post /api/v2/manager/connect "$(cat "$TOKEN_FILE")" "$work/connect.json" "$work/session.json")
[ "$status" = 200 ] || { echo "diy-agent: connect: HTTP $status: $(cat "$work/session.json")" >&2; exit 1; }
session=$(jq -r .sessionToken "$work/session.json")
manager=$(jq -r .managerId "$work/session.json")
selector="app.kubernetes.io/managed-by=nexo-manager,nexo.io/owner-id=$OWNER_ID"

seq=0
while :; do
  seq=$((seq + 1))
  "$KUBECTL" get nexoproxies.nexo.io -n "$NAMESPACE" -l "$selector" -o json >"$work/proxies.json"
  "$KUBECTL" get deployments.apps -n "$NAMESPACE" -l "$selector" -o json >"$work/deployments.json"
  jq -n --slurpfile p "$work/proxies.json" --slurpfile d "$work/deployments.json" \
    --arg m "$manager" --argjson seq "$seq" --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --arg uid "$uid" --arg v "$version" --arg img "$PROXY_IMAGE" --argjson caps "$caps" \
    '([$p[0].items[] | {name: .metadata.name, namespace: .metadata.namespace, kind: "NexoProxy",
                         replicas: (.spec.replicas // 1), image: .spec.image}]
      + [$d[0].items[] | {name: .metadata.name, namespace: .metadata.namespace, kind: "Deployment",
                          replicas: (.spec.replicas // 1), image: .spec.template.spec.containers[0].image}])
     | sort_by(.namespace, .name) as $list
     | {managerId: $m, sequence: $seq, sentAt: $now,
        manager: {version: "0.0.0-diy", build: "diy", protocolVersion: 2, capabilities: $caps},
        proxyImage: $img, managedProxyCount: ($list | length), deployments: $list,
        cluster: {uid: $uid, kubernetesVersion: $v}, pendingAcks: []}' >"$work/heartbeat.json"
  status=$(post /api/v2/manager/heartbeat "$session" "$work/heartbeat.json" "$work/answer.json")
  if [ "$status" = 200 ]; then
    jq -c '.commands[]?' "$work/answer.json" >"$work/commands.jsonl"
    while IFS= read -r command; do
      id=$(jq -r .id <<<"$command")
      ns=$(jq -r .payload.deployment.namespace <<<"$command")
      jq --arg owner "$OWNER_ID" \
        '{apiVersion: "v1", kind: "List", items: [.payload.deployment.name as $d | .payload.manifests[]
          | .metadata.labels += {"app.kubernetes.io/managed-by": "nexo-manager",
                                 "nexo.io/owner-id": $owner, "nexo.io/deployment": $d}]}' \
        <<<"$command" >"$work/apply.json"
      if "$KUBECTL" apply --server-side --field-manager=diy-agent -n "$ns" -f "$work/apply.json" \
        >"$work/apply.out" 2>&1; then
        result=applied
      else
        result=failed
      fi
      jq -n --arg m "$manager" --arg id "$id" --arg r "$result" --rawfile out "$work/apply.out" \
        --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        '{managerId: $m, commandId: $id, result: $r, message: ($out[0:500]),
          completedAt: $now, attempt: 1, resources: []}' >"$work/ack.json"
      status=$(post "/api/v2/manager/commands/$id/ack" "$session" "$work/ack.json" "$work/ack-answer.json")
      [ "$status" = 200 ] || [ "$status" = 204 ] || echo "diy-agent: ack $id: HTTP $status" >&2
    done <"$work/commands.jsonl"
  else
    echo "diy-agent: heartbeat: HTTP $status: $(head -c 300 "$work/answer.json")" >&2
  fi
  echo "cycle $seq"
  if [ "$CYCLES" -gt 0 ] && [ "$seq" -ge "$CYCLES" ]; then
    break
  fi
  sleep "$INTERVAL"
done
