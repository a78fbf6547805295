#!/usr/bin/env bash
# Runs every test of the project: unit tests, and the integration and
# end-to-end tests against one real Kubernetes test bed (built once and
# cached; see tests/testbed/testbed.sh), shared by all test binaries; then
# the sandbox scenario once. Afterwards it checks that no control-plane
# process is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

testbed=tests/testbed/testbed.sh
bash "$testbed" build
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
left=$(pgrep -f "^$bin_dir/(etcd|kube-apiserver|kube-controller-manager)( |$)" || true)
if [ -n "$left" ]; then
  echo "tests/run.sh: control-plane processes left running: $left" >&2
  exit 1
fi
echo "tests/run.sh: all tests passed; no control-plane process left"
