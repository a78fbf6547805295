#!/usr/bin/env bash
# Runs every test of the project: the release check (.ci/release-check:
# format, clippy, the declared rust-version, cargo deny), then every test
# target (`cargo test --workspace --all-targets`) against a real Kubernetes
# test bed of the newest supported release (see tests/testbed/testbed.sh),
# the node tests (tests/node.rs) on a test bed with a node of their own;
# then the end-to-end tests against the API server (every tests/*.rs that
# talks to one, but for the node's, the arm64 run and the empty-root run,
# which are about the binary rather than the release) once more against
# each older supported release, and once against kube-apiserver on kine
# over SQLite (the k3s datastore); then the sandbox scenario once.
# It prints one line per release and datastore:
#   kubernetes v1.35.4: N passed, 0 failed
# Afterwards it checks that no process and no network namespace is left of
# the test beds this run started (and only of those: a test bed started by
# hand keeps running, untouched and unnamed).
#
# Arguments go to every `cargo test` (a filter, say).
#
# To fit CI's time, the node tests (about 15 minutes, most of it waiting
# for the kubelet to rotate a token) run in the background, beside the
# others: they have a test bed, a network namespace and a simulator of
# their own. Their output is shown when they end.
set -euo pipefail
cd "$(dirname "$0")/.."

# First what is quick to fail: format, clippy, MSRV, licences and bans.
bash .ci/release-check

testbed=tests/testbed/testbed.sh
read -r -a versions <<<"$(bash "$testbed" bin --versions)"
newest=${versions[${#versions[@]}-1]}
# Every supported release's control plane, each built once and cached;
# the newest's node, and kine.
for v in "${versions[@]}"; do
  NEXO_K8S_VERSION=$v bash "$testbed" build
done
NEXO_K8S_VERSION=$newest bash "$testbed" build --node --kine
kine=$(basename "$(dirname "$(bash "$testbed" bin --kine)")" | sed 's/^kine-/kine /')

# The static release binaries, built exactly as Dockerfile.distroless builds
# them; tests/static_binary.rs checks the amd64 one and runs it in an empty
# root, tests/arm64.rs runs the arm64 one under qemu-user, the node tests
# put both in the multi-architecture image, and the short form of the
# benchmark suite measures the amd64 one.
NEXO_STATIC_BINARY=$(bash tests/build-static.sh amd64)
NEXO_STATIC_BINARY_ARM64=$(bash tests/build-static.sh arm64)
export NEXO_STATIC_BINARY NEXO_STATIC_BINARY_ARM64

# Every test bed of this run (its own, the node tests', the sandbox's) is
# listed here by `testbed.sh start`, which finds the file in the environment
# they all inherit: the check at the end looks at those test beds only.
record=$(mktemp -t nexo-run-testbeds.XXXXXX)
logs=$(mktemp -d -t nexo-run-logs.XXXXXX)
export NEXO_TESTBED_RECORD=$record
dir=
node_pid=
cleanup() {
  [ -z "$dir" ] || bash "$testbed" stop "$dir"
  dir=
  [ -z "$node_pid" ] || kill "$node_pid" 2>/dev/null || true
}
trap 'cleanup; rm -rf "$record" "$logs"' EXIT
trap 'exit 130' INT TERM

# Everything compiled once, before anything runs side by side.
cargo test --locked --workspace --all-targets --no-run

NEXO_K8S_VERSION=$newest cargo test --locked --test node "$@" >"$logs/node.log" 2>&1 &
node_pid=$!
echo "tests/run.sh: the node tests run in the background (kubernetes $newest), output at their end"

# The test targets of one run: all of them (the node's aside, running
# already), or the end-to-end ones.
all_targets=(--workspace --lib --bins --benches)
e2e_targets=()
for f in tests/*.rs; do
  name=$(basename "$f" .rs)
  case $name in
    node) continue ;;
  esac
  all_targets+=(--test "$name")
  # Not about the release: the binary's own properties, and the checks
  # that read the source.
  case $name in
    arm64 | static_binary | layers | source_rules | release_check | hostile_values) continue ;;
  esac
  e2e_targets+=(--test "$name")
done

# Per run: its label, tests passed and failed, seconds.
labels=() passes=() fails=() times=()
failures=0
# Passed and failed tests in a cargo test log: the sums of its
# `test result:` lines.
count() { # log
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
       END { printf "%d %d\n", p, f }' "$1"
}
# Starts a test bed of release VERSION (with --kine: on kine), runs cargo
# test with the remaining arguments against it, stops it, records its line.
suite() { # label version [--kine] -- cargo-test-args...
  local label=$1 version=$2 kine_flag=
  shift 2
  if [ "${1:-}" = --kine ]; then kine_flag=--kine; shift; fi
  [ "${1:-}" = -- ] && shift
  local log=$logs/suite-${#labels[@]}.log started=$SECONDS rc=0
  dir=$(mktemp -d -t nexo-testbed.XXXXXX)
  rmdir "$dir"
  echo "tests/run.sh: --- $label ---"
  NEXO_K8S_VERSION=$version bash "$testbed" start "$dir" $kine_flag $$
  NEXO_K8S_VERSION=$version NEXO_TESTBED_DIR=$dir \
    cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$log" || rc=$?
  bash "$testbed" stop "$dir"
  dir=
  local passed failed
  read -r passed failed < <(count "$log")
  if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then failed="?"; fi
  [ "$rc" = 0 ] || failures=$((failures + 1))
  labels+=("$label") passes+=("$passed") fails+=("$failed") times+=($((SECONDS - started)))
}

suite "kubernetes $newest" "$newest" -- "${all_targets[@]}" "$@"
for v in "${versions[@]}"; do
  [ "$v" = "$newest" ] || suite "kubernetes $v" "$v" -- "${e2e_targets[@]}" "$@"
done
suite "$kine (SQLite) with kubernetes $newest" "$newest" --kine -- "${e2e_targets[@]}" "$@"

node_rc=0
wait "$node_pid" || node_rc=$?
node_pid=
echo "tests/run.sh: --- the node tests (kubernetes $newest) ---"
cat "$logs/node.log"
read -r node_passed node_failed < <(count "$logs/node.log")
if [ "$node_rc" != 0 ]; then
  failures=$((failures + 1))
  [ "$node_failed" != 0 ] || node_failed="?"
fi
# The newest release's line counts the node tests too.
passes[0]=$((passes[0] + node_passed))
case ${fails[0]}$node_failed in
  *\?*) fails[0]="?" ;;
  *) fails[0]=$((fails[0] + node_failed)) ;;
esac

echo
for i in "${!labels[@]}"; do
  echo "${labels[$i]}: ${passes[$i]} passed, ${fails[$i]} failed"
done
echo "(seconds per run: $(for i in "${!labels[@]}"; do printf '%s %s; ' "${labels[$i]}" "${times[$i]}"; done)node tests beside them)"
if [ "$failures" != 0 ]; then
  echo "tests/run.sh: $failures of the runs above failed" >&2
  exit 1
fi

# The main job must keep working: the sandbox scenario, once.
bash tests/sandbox.sh --once
bash "$testbed" leftovers "$record" ||
  { echo "tests/run.sh: this run left test-bed processes or network namespaces (above)" >&2; exit 1; }
echo "tests/run.sh: all tests passed; nothing left of the $(wc -l <"$record") test bed(s) this run started"
