#!/usr/bin/env bash
# Runs every test of the project: unit tests, and the integration and
# end-to-end tests against one real Kubernetes test bed (built once and
# cached; see tests/testbed/testbed.sh), shared by all test binaries; the
# node tests (tests/node.rs) on a test bed with a node of their own; then
# the sandbox scenario once. Afterwards it checks that no process of a test
# bed and no network namespace of one is left.
set -euo pipefail
cd "$(dirname "$0")/.."

testbed=tests/testbed/testbed.sh
bash "$testbed" build --node
bin_dir=$(bash "$testbed" bin)

# The static release binary, built exactly as Dockerfile.distroless builds it;
# tests/static_binary.rs checks it and runs it in an empty root, and the
# short form of the benchmark suite measures it.
NEXO_STATIC_BINARY=$(bash tests/build-static.sh)
export NEXO_STATIC_BINARY

dir=$(mktemp -d -t nexo-testbed.XXXXXX)
rmdir "$dir"
cleanup() { bash "$testbed" stop "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
bash "$testbed" start "$dir" $$
export NEXO_TESTBED_DIR=$dir

cargo test --locked --workspace --all-targets "$@"

cleanup
trap - EXIT

# The main job must keep working: the sandbox scenario, once.
bash tests/sandbox.sh --once
node_bin_dir=$(bash "$testbed" bin --node)
left=$(pgrep -f "^($bin_dir|$node_bin_dir)/(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kube-proxy)( |$)" || true)
left="$left $(pgrep -f '^containerd --config .*/containerd/config.toml' || true)"
if [ -n "${left// /}" ]; then
  echo "tests/run.sh: test-bed processes left running: $left" >&2
  exit 1
fi
if ip netns list 2>/dev/null | grep -q '^nexo-tb-'; then
  echo "tests/run.sh: test-bed network namespaces left: $(ip netns list | grep '^nexo-tb-')" >&2
  exit 1
fi
echo "tests/run.sh: all tests passed; no test-bed process or network namespace left"
