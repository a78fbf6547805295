#!/usr/bin/env bash
# The benchmark suite, full form: builds the test bed and the peer (OCM's
# work agent; both cached) and the static binary the image ships, starts a
# control plane on loopback, and runs `cargo bench --bench footprint`, then
# `cargo bench --bench peer` (on an audited test bed of its own); each
# prints its table and writes it into BENCHMARKS.md. About 55 minutes for
# the first and 75 for the second on 2 cores once things are built. Extra
# arguments go to both (`--short` runs the small sizes; `--only PARTS` the
# parts to run, by name: the footprint's image, start, idle, deploy, sizes,
# greedy, soak, and `peer`; `--idle-seconds N` the peer's idle windows).
#
# Needs what tests/run.sh needs, plus jq (the do-it-yourself loop) and
# apt-get (the image's base layer is rebuilt from Debian's packages).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in curl jq strace apt-get; do
  command -v "$tool" >/dev/null 2>&1 || { echo "tests/bench.sh: '$tool' is required" >&2; exit 1; }
done
testbed=tests/testbed/testbed.sh
bash "$testbed" build --peer
NEXO_STATIC_BINARY=$(bash tests/build-static.sh)
export NEXO_STATIC_BINARY

if [ -z "${NEXO_TESTBED_DIR:-}" ]; then
  dir=$(mktemp -d -t nexo-bench.XXXXXX)
  rmdir "$dir"
  trap 'bash "$testbed" stop "$dir"' EXIT
  trap 'exit 130' INT TERM
  bash "$testbed" start "$dir" $$
  export NEXO_TESTBED_DIR=$dir
fi
cargo bench --locked --bench footprint -- "$@"
cargo bench --locked --bench peer -- "$@"
