#!/usr/bin/env bash
# The node of the test bed: containerd, the kubelet and kube-proxy. Started
# by `testbed.sh start DIR --node` as the first process of a new PID and
# mount namespace inside the test bed's network namespace:
#
#   nsenter --net=/run/netns/NS unshare --pid --fork --kill-child --mount \
#     --propagation private --mount-proc bash node.sh DIR
#
# so that when it ends, the kernel ends every process it started (shims and
# containers included) and every mount it made goes with the namespace.
# It reads DIR/node.env (written by testbed.sh) and logs to DIR/logs/.
set -euo pipefail
DIR=${1:?usage: node.sh DIR}
# /sys as this network namespace sees it (its interfaces), keeping the
# cgroup hierarchies: a private mount namespace, so the host sees none of it.
mkdir -p "$DIR/cgroup-move"
mount --rbind /sys/fs/cgroup "$DIR/cgroup-move"
mount -t sysfs sysfs /sys
mount --move "$DIR/cgroup-move" /sys/fs/cgroup
# shellcheck disable=SC1091
. "$DIR/node.env"

pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 1
  exit 0
}
trap stop TERM INT

# The pause and other images are imported through containerd's socket.
containerd --config "$DIR/containerd/config.toml" >"$DIR/logs/containerd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  [ -S "$DIR/containerd/containerd.sock" ] && break
  sleep 0.1
done
[ -S "$DIR/containerd/containerd.sock" ] || { echo "containerd did not start" >&2; exit 1; }
ctr --address "$DIR/containerd/containerd.sock" -n k8s.io images import \
  --no-unpack=false "$PAUSE_ARCHIVE" >"$DIR/logs/pause-import.log" 2>&1

"$NODE_BIN_DIR/kubelet" --config "$DIR/kubelet/config.yaml" \
  --kubeconfig "$DIR/kubelet.kubeconfig" --hostname-override "$NODE_NAME" \
  --node-ip "$NODE_IP" --root-dir "$DIR/kubelet/root" --cert-dir "$DIR/kubelet/pki" \
  --v=1 >"$DIR/logs/kubelet.log" 2>&1 &
pids+=($!)

"$NODE_BIN_DIR/kube-proxy" --config "$DIR/kube-proxy.yaml" >"$DIR/logs/kube-proxy.log" 2>&1 &
pids+=($!)

echo ready >"$DIR/node.started"
# Lives as long as its children do; a TERM ends them all.
wait -n "${pids[@]}" || true
echo "node.sh: a node process exited; stopping the node" >&2
stop
