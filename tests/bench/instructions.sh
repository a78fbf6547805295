#!/usr/bin/env bash
# Instructions, cache and branch misses of one heartbeat cycle, counted by
# callgrind rather than timed: a difference of 1 % in CPU per heartbeat is
# below what the footprint bench's CPU time can tell apart on a shared
# machine (its runs spread by 10 % or more), not below this.
#
#   instructions.sh BINARY [PROXIES]        (PROXIES: default 10000)
#
# Runs `footprint --bench --only sizes --sizes PROXIES` on the test bed
# named by NEXO_TESTBED_DIR (tests/testbed/testbed.sh start), with BINARY
# under `valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes`
# (through NEXO_BENCH_EMULATOR), a profile dumped as each heartbeat's body
# is built, so that each dump holds exactly one cycle. BINARY must keep its
# symbols: build it with `CARGO_PROFILE_RELEASE_STRIP=none bash
# tests/build-static.sh amd64` (the code is the shipped one; only the
# symbol table stays). Prints, for each event, the median over the cycles
# after the first two (the start and the first list): Ir instructions, Dr
# and Dw data reads and writes, I1mr/D1mr/D1mw first-level misses, Bc/Bcm
# conditional branches and their mispredictions, Bi/Bim indirect ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: instructions.sh BINARY [PROXIES]" >&2; exit 2; }
bin=$(readlink -f "$1")
size=${2:-10000}
command -v valgrind >/dev/null ||
  { echo "instructions.sh: valgrind is required (apt-get install valgrind)" >&2; exit 1; }
[ -n "${NEXO_TESTBED_DIR:-}" ] ||
  { echo "instructions.sh: NEXO_TESTBED_DIR is not set (start one with tests/testbed/testbed.sh start DIR)" >&2; exit 1; }
nm "$bin" 2>/dev/null | grep heartbeat_body >/dev/null ||
  { echo "instructions.sh: $bin has no symbols (build it with CARGO_PROFILE_RELEASE_STRIP=none)" >&2; exit 1; }

work=$(mktemp -d -t nexo-instructions.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/callgrind" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind -q --cache-sim=yes --branch-sim=yes \
  --dump-before='*heartbeat_body*' --callgrind-out-file=$work/out.%p "\$@"
EOF
chmod +x "$work/callgrind"
cargo test --locked --no-run --bench footprint >&2
bench=$(ls -t target/debug/deps/footprint-* | grep -v '\.d$' | head -1)
NEXO_BENCH_EMULATOR="$work/callgrind" NEXO_STATIC_BINARY="$bin" \
  "$bench" --bench --only sizes --sizes "$size" >&2
python3 - "$work" <<'EOF'
import glob, statistics, sys
files = sorted(glob.glob(sys.argv[1] + "/out.*.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
if len(files) < 5:
    sys.exit(f"instructions.sh: only {len(files)} heartbeat cycles were profiled")
events = open(files[0]).read().split("events:")[1].split("\n")[0].split()
rows = []
for f in files[2:]:
    line = next(l for l in open(f) if l.startswith("summary:"))
    rows.append([int(x) for x in line.split()[1:]])
print(f"{len(rows)} heartbeat cycles, median per cycle:")
for name, column in zip(events, zip(*rows)):
    print(f"{name:5} {statistics.median(column):>14,.0f}")
EOF
