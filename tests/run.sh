#!/usr/bin/env bash
# Runs every test of the project: the release check (.ci/release-check:
# format, clippy, the declared rust-version, cargo deny), unit tests, and the integration and
# end-to-end tests against one real Kubernetes test bed (built once and
# cached; see tests/testbed/testbed.sh), shared by all test binaries; the
# node tests (tests/node.rs) on a test bed with a node of their own; then
# the sandbox scenario once. Afterwards it checks that no process and no
# network namespace is left of the test beds this run started (and only of
# those: a test bed started by hand keeps running, untouched and unnamed).
set -euo pipefail
cd "$(dirname "$0")/.."

# First what is quick to fail: format, clippy, MSRV, licences and bans.
bash .ci/release-check

testbed=tests/testbed/testbed.sh
bash "$testbed" build --node

# The static release binary, built exactly as Dockerfile.distroless builds it;
# tests/static_binary.rs checks it and runs it in an empty root, and the
# short form of the benchmark suite measures it.
NEXO_STATIC_BINARY=$(bash tests/build-static.sh)
export NEXO_STATIC_BINARY
# The arm64 one, which tests/arm64.rs runs under qemu-user.
NEXO_STATIC_BINARY_ARM64=$(bash tests/build-static.sh arm64)
export NEXO_STATIC_BINARY_ARM64

# Every test bed of this run (its own, the node tests', the sandbox's) is
# listed here by `testbed.sh start`, which finds the file in the environment
# they all inherit: the check at the end looks at those test beds only.
record=$(mktemp -t nexo-run-testbeds.XXXXXX)
export NEXO_TESTBED_RECORD=$record

dir=$(mktemp -d -t nexo-testbed.XXXXXX)
rmdir "$dir"
cleanup() { bash "$testbed" stop "$dir"; }
trap 'rm -f "$record"; cleanup' EXIT
trap 'exit 130' INT TERM
bash "$testbed" start "$dir" $$
export NEXO_TESTBED_DIR=$dir

cargo test --locked --workspace --all-targets "$@"

cleanup
trap 'rm -f "$record"' EXIT

# The main job must keep working: the sandbox scenario, once.
bash tests/sandbox.sh --once
bash "$testbed" leftovers "$record" ||
  { echo "tests/run.sh: this run left test-bed processes or network namespaces (above)" >&2; exit 1; }
echo "tests/run.sh: all tests passed; nothing left of the $(wc -l <"$record") test bed(s) this run started"
