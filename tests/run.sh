#!/usr/bin/env bash
# Runs every test of the project: the release check (.ci/release-check:
# format, clippy, the declared rust-version, cargo deny), then every test
# target (`cargo test --workspace --all-targets`) against a real Kubernetes
# test bed of the newest supported release (see tests/testbed/testbed.sh),
# the node tests (tests/node.rs) on a test bed with a node of their own;
# then the end-to-end tests against the API server (every tests/*.rs that
# talks to one, but for the node's, the arm64 run, the empty-root run and
# the chart's packaging, which are about the binary and the package rather
# than the release) once more against
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
# To fit CI's time, the runs go side by side, each with a test bed (and
# simulators) of its own: the node tests (about 15 minutes, most of it
# waiting for the kubelet to rotate a token), the run against the newest
# release, and the other runs in two lanes. The tests mostly wait, so the
# two cores are not the limit. Each run's output is shown when all end.
set -euo pipefail
cd "$(dirname "$0")/.."

# What a fresh machine lacks (Debian packages, rustup targets).
bash tests/install.sh

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
# The Helm versions the chart's tests use (Helm 4 unless a test says 3).
echo "tests/run.sh: helm $("$(bash "$testbed" bin --helm)/helm" version --short) and $("$(bash "$testbed" bin --helm3)/helm" version --short)"

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
node_pid=
lane_pids=()
# A run's test bed stops itself once this script is gone (its reaper
# watches this process); what is still running is stopped here.
cleanup() {
  local pid
  for pid in $node_pid ${lane_pids[@]+"${lane_pids[@]}"}; do kill "$pid" 2>/dev/null || true; done
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
  # Not about the release: the binary's own properties, the checks that
  # read the source, the image's supply chain, and what the Manager does
  # with a peer's faults (a noisy or slow CP, a proxy's watch and Event
  # faults), which no release changes: those run against the newest only.
  case $name in
    arm64 | static_binary | layers | source_rules | release_check | hostile_values | chart_package | supply_chain) continue ;;
    noisy_cp | slow_peers | watch_faults | held) continue ;;
  esac
  e2e_targets+=(--test "$name")
done

# Passed and failed tests in a cargo test log: the sums of its
# `test result:` lines.
count() { # log
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
       END { printf "%d %d\n", p, f }' "$1"
}
# One run: starts a test bed of release VERSION (--kine: on kine), runs
# cargo test with the remaining arguments against it into $logs/N.log,
# stops the test bed, and writes `exit-status passed failed seconds` to
# $logs/N.result.
suite() { # N version [--kine] -- cargo-test-args...
  local n=$1 version=$2 kine_flag= bed rc=0 started=$SECONDS
  shift 2
  if [ "${1:-}" = --kine ]; then kine_flag=--kine; shift; fi
  [ "${1:-}" = -- ] && shift
  bed=$(mktemp -d -t nexo-testbed.XXXXXX)
  rmdir "$bed"
  {
    NEXO_K8S_VERSION=$version bash "$testbed" start "$bed" $kine_flag $$ &&
      NEXO_K8S_VERSION=$version NEXO_TESTBED_DIR=$bed cargo test --locked --no-fail-fast "$@"
  } >"$logs/$n.log" 2>&1 || rc=$?
  bash "$testbed" stop "$bed" >>"$logs/$n.log" 2>&1 || true
  local passed failed
  read -r passed failed < <(count "$logs/$n.log")
  echo "$rc $passed $failed $((SECONDS - started))" >"$logs/$n.result"
}

# The runs, each on a test bed of its own, their labels by number: 0, the
# newest release with every test target; then each older release and kine
# with the end-to-end ones. The tests mostly wait (for heartbeats, leases,
# the garbage collector): the node tests, the first run and two lanes of
# the others share the two cores without contention (load under 3).
labels=("kubernetes $newest")
runs=()
for v in "${versions[@]}"; do
  [ "$v" = "$newest" ] && continue
  labels+=("kubernetes $v")
  runs+=("$v")
done
labels+=("$kine (SQLite) with kubernetes $newest")
runs+=("$newest --kine")
lane() { # run-numbers...
  local n
  for n in "$@"; do
    # shellcheck disable=SC2086 # "VERSION [--kine]"
    suite "$n" ${runs[$((n - 1))]} -- "${e2e_targets[@]}" ${args[@]+"${args[@]}"}
  done
}
args=("$@")
odd=() even=()
for n in $(seq 1 ${#runs[@]}); do
  if [ $((n % 2)) = 1 ]; then odd+=("$n"); else even+=("$n"); fi
done
lane "${odd[@]}" &
lane_pids+=($!)
[ ${#even[@]} = 0 ] || { lane "${even[@]}" & lane_pids+=($!); }
echo "tests/run.sh: ${labels[*]:1} run in two lanes in the background, output at their end"

suite 0 "$newest" -- "${all_targets[@]}" "$@"
cat "$logs/0.log"
for pid in "${lane_pids[@]}"; do wait "$pid" || true; done
lane_pids=()
node_rc=0
wait "$node_pid" || node_rc=$?
node_pid=
for n in $(seq 1 ${#runs[@]}); do
  echo "tests/run.sh: --- ${labels[$n]} ---"
  cat "$logs/$n.log"
done
echo "tests/run.sh: --- the node tests (kubernetes $newest) ---"
cat "$logs/node.log"
read -r node_passed node_failed < <(count "$logs/node.log")

# One line per release and datastore; the newest release's counts the
# node tests too. A run that failed without a failed test (a test bed that
# did not start, a build error) shows `?` failed.
failures=0
echo
for n in "${!labels[@]}"; do
  [ -f "$logs/$n.result" ] || echo "1 0 0 0" >"$logs/$n.result"
  read -r rc passed failed seconds <"$logs/$n.result"
  if [ "$n" = 0 ]; then
    passed=$((passed + node_passed)) failed=$((failed + node_failed))
    [ "$node_rc" = 0 ] || rc=1
  fi
  if [ "$rc" != 0 ]; then
    failures=$((failures + 1))
    [ "$failed" != 0 ] || failed="?"
  fi
  echo "${labels[$n]}: $passed passed, $failed failed"
  times="${times:-}${labels[$n]} ${seconds} s; "
done
echo "(wall time per run: ${times}the node tests beside them)"
if [ "$failures" != 0 ]; then
  echo "tests/run.sh: $failures of the runs above failed" >&2
  exit 1
fi

# The main job must keep working: the sandbox scenario, once.
bash tests/sandbox.sh --once
bash "$testbed" leftovers "$record" ||
  { echo "tests/run.sh: this run left test-bed processes or network namespaces (above)" >&2; exit 1; }
echo "tests/run.sh: all tests passed; nothing left of the $(wc -l <"$record") test bed(s) this run started"
