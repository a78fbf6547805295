#!/usr/bin/env bash
# Adds a namespace the Manager manages, as README.md "Adding a managed
# namespace" says: the Manager's RoleBinding to read it, the executor's
# ServiceAccount and its RoleBinding (what commands write there is written
# as it). The namespace enforces the restricted Pod Security profile.
# Idempotent.
#
#   managed-namespace.sh KUBECTL KUBECONFIG MANAGER_NAMESPACE NAMESPACE
set -euo pipefail
kubectl=${1:?usage: managed-namespace.sh KUBECTL KUBECONFIG MANAGER_NAMESPACE NAMESPACE}
kubeconfig=${2:?} manager_ns=${3:?} ns=${4:?}
k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }
apply() { k apply -f - >/dev/null; }

k create namespace "$ns" --dry-run=client -o yaml | apply
k label --overwrite namespace "$ns" pod-security.kubernetes.io/enforce=restricted >/dev/null
k -n "$ns" create rolebinding nexo-manager-managed --clusterrole=nexo-manager-managed \
  --serviceaccount="$manager_ns:nexo-manager" --dry-run=client -o yaml | apply
k -n "$ns" create serviceaccount nexo-executor --dry-run=client -o yaml | apply
k -n "$ns" create rolebinding nexo-executor --clusterrole=nexo-manager-executor \
  --serviceaccount="$ns:nexo-executor" --dry-run=client -o yaml | apply
