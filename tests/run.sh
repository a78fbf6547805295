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
# over SQLite (the k3s datastore); and the sandbox scenario once.
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
# waiting for the kubelet to rotate a token) beside five lanes of runs,
# each release's tests in parts of a few minutes. The tests mostly wait,
# so the two cores are not the limit. Each run's output is shown when all
# end.
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

# Everything compiled once, before anything runs side by side (a cargo
# build in a lane would hold the build directory's lock while the other
# lanes wait for it): the tests, and the sandbox's release binaries.
cargo test --locked --workspace --all-targets --no-run
cargo build --release --locked --bin nexo-manager -p nexo-manager --bin nexo-cpsim -p nexo-cpsim

NEXO_K8S_VERSION=$newest cargo test --locked --test node "$@" >"$logs/node.log" 2>&1 &
node_pid=$!
echo "tests/run.sh: the node tests run in the background (kubernetes $newest), output at their end"

# The test targets: the end-to-end ones (they talk to an API server, and
# run against every supported release and kine), the peer-fault ones and
# the rest (against the newest release only).
e2e_names=()
fault_targets=()
rest_targets=(--workspace --lib --bins --benches)
for f in tests/*.rs; do
  name=$(basename "$f" .rs)
  case $name in
    node) continue ;;
    # Not about the release: the binary's own properties, the checks that
    # read the source, the image's supply chain.
    arm64 | static_binary | layers | source_rules | release_check | hostile_values | chart_package | supply_chain)
      rest_targets+=(--test "$name") ;;
    # What the Manager does with a peer's faults (a noisy or slow CP, a
    # proxy's watch and Event faults), which no release changes.
    noisy_cp | slow_peers | watch_faults | held) fault_targets+=(--test "$name") ;;
    *) e2e_names+=("$name") ;;
  esac
done
# The end-to-end targets in two halves of about the same length (every
# other one by name), so that a release's run can be two of about 7
# minutes in different lanes.
half_a=() half_b=()
for i in "${!e2e_names[@]}"; do
  if [ $((i % 2)) = 0 ]; then half_a+=(--test "${e2e_names[$i]}"); else half_b+=(--test "${e2e_names[$i]}"); fi
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

# The runs, each on a test bed of its own: the newest release in four
# parts (each half of the end-to-end targets, the peer-fault targets, the
# rest), each older release and kine in two halves, and the sandbox.
# Each is labelled by release (a release's parts are counted together)
# and weighed in seconds as measured on 2 cores, and they are shared out
# among NEXO_TEST_LANES lanes (5), the heaviest first, each to the lane
# with the least so far. The tests mostly wait (for heartbeats, leases,
# the garbage collector), so five test beds and the node tests share two
# cores; eight test beds at once (every run side by side) loaded them to
# about 15, and a lease renewal came late enough for the fence to refuse
# a write.
names=() labels=() specs=() weights=()
add() { # label weight "VERSION [--kine]" targets-array-name
  names+=("$1") weights+=("$2") specs+=("$3 $4")
  local l
  for l in ${labels[@]+"${labels[@]}"}; do [ "$l" = "$1" ] && return; done
  labels+=("$1")
}
add "kubernetes $newest" 450 "$newest" half_a
add "kubernetes $newest" 450 "$newest" half_b
add "kubernetes $newest" 300 "$newest" fault_targets
add "kubernetes $newest" 450 "$newest" rest_targets
for v in "${versions[@]}"; do
  [ "$v" = "$newest" ] && continue
  add "kubernetes $v" 400 "$v" half_a
  add "kubernetes $v" 400 "$v" half_b
done
add "$kine (SQLite) with kubernetes $newest" 375 "$newest --kine" half_a
add "$kine (SQLite) with kubernetes $newest" 375 "$newest --kine" half_b
sandbox=${#names[@]}
names+=("the sandbox") weights+=(200) specs+=("sandbox")
lanes=${NEXO_TEST_LANES:-5}
declare -a lane_of lane_load
for l in $(seq 0 $((lanes - 1))); do lane_load[l]=0 lane_of[l]=""; done
for n in $(for i in "${!weights[@]}"; do echo "${weights[$i]} $i"; done | sort -rn | cut -d' ' -f2); do
  best=0
  for l in $(seq 1 $((lanes - 1))); do
    [ "${lane_load[l]}" -lt "${lane_load[best]}" ] && best=$l
  done
  lane_load[best]=$((lane_load[best] + weights[n]))
  lane_of[best]="${lane_of[best]} $n"
done
args=("$@")
one() { # run-number
  local n=$1 spec version kine_flag= which
  if [ "$n" = "$sandbox" ]; then
    local rc=0 started=$SECONDS
    bash tests/sandbox.sh --once >"$logs/$n.log" 2>&1 || rc=$?
    echo "$rc 0 0 $((SECONDS - started))" >"$logs/$n.result"
    return
  fi
  read -r -a spec <<<"${specs[$n]}"
  version=${spec[0]}
  which=${spec[${#spec[@]}-1]}
  [ "${spec[1]}" = --kine ] && kine_flag=--kine
  local -n targets=$which
  # shellcheck disable=SC2086 # an empty flag is no argument
  suite "$n" "$version" $kine_flag -- "${targets[@]}" ${args[@]+"${args[@]}"}
}
lane() { # run-numbers...
  local n
  for n in "$@"; do one "$n"; done
}
for l in $(seq 0 $((lanes - 1))); do
  # shellcheck disable=SC2086 # a list of numbers
  lane ${lane_of[l]} &
  lane_pids+=($!)
done
echo "tests/run.sh: ${#names[@]} runs in $lanes lanes in the background, output at their end"
for pid in "${lane_pids[@]}"; do wait "$pid" || true; done
lane_pids=()
node_rc=0
wait "$node_pid" || node_rc=$?
node_pid=
for n in "${!names[@]}"; do
  echo "tests/run.sh: --- ${names[$n]} (${specs[$n]}) ---"
  cat "$logs/$n.log"
done
echo "tests/run.sh: --- the node tests (kubernetes $newest) ---"
cat "$logs/node.log"
read -r node_passed node_failed < <(count "$logs/node.log")

# One line per release and datastore (its parts' counts summed; the
# newest release's counts the node tests too), and the sandbox's. A part
# that failed without a failed test (a test bed that did not start, a
# build error) shows `?` failed.
failures=0
echo
for label in "${labels[@]}" "the sandbox"; do
  rc=0 passed=0 failed=0 times=
  for n in "${!names[@]}"; do
    [ "${names[$n]}" = "$label" ] || continue
    [ -f "$logs/$n.result" ] || echo "1 0 0 0" >"$logs/$n.result"
    read -r r p f secs <"$logs/$n.result"
    passed=$((passed + p)) failed=$((failed + f)) times="$times ${secs} s"
    [ "$r" = 0 ] || rc=1
  done
  if [ "$label" = "kubernetes $newest" ]; then
    passed=$((passed + node_passed)) failed=$((failed + node_failed))
    [ "$node_rc" = 0 ] || rc=1
  fi
  if [ "$rc" != 0 ]; then
    failures=$((failures + 1))
    [ "$failed" != 0 ] || failed="?"
  fi
  if [ "$label" = "the sandbox" ]; then
    if [ "$rc" = 0 ]; then echo "the sandbox: passed ($times)"; else echo "the sandbox: failed ($times)"; fi
  else
    echo "$label: $passed passed, $failed failed (wall time of its parts:$times)"
  fi
done
for l in $(seq 0 $((lanes - 1))); do
  t=0
  for n in ${lane_of[l]}; do read -r _ _ _ secs <"$logs/$n.result"; t=$((t + secs)); done
  echo "tests/run.sh: lane $l: runs${lane_of[l]}, $t s"
done
if [ "$failures" != 0 ]; then
  echo "tests/run.sh: $failures of the lines above failed" >&2
  exit 1
fi

bash "$testbed" leftovers "$record" ||
  { echo "tests/run.sh: this run left test-bed processes or network namespaces (above)" >&2; exit 1; }
echo "tests/run.sh: all tests passed; nothing left of the $(wc -l <"$record") test bed(s) this run started"
