#!/usr/bin/env bash
# The elastic bench (attach/detach on a running VM) of two commits in turns, each with the agent
# of its own commit (the bench runs `$RODVR_AGENT`), so attach figures compare like with like.
#
#   scripts/bench-elastic-compare.sh OLD NEW [RUNS [SIZES [SERVERS]]]
#
# OLD and NEW are commits; RUNS (default 200), SIZES (default 1) and SERVERS (default spares:
# managed servers with warm spares; a commit whose bench has no such argument ignores it) go to
# each bench. ROUNDS (default 3) sets how many turns each takes. Needs root, `ip` and `nft`.
# Builds go to worktrees under $GSAAS_BENCH_COMPARE_DIR (default /var/tmp/gsaas-bench-compare),
# as scripts/bench-compare.sh's do: release builds, minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
old=$1 new=$2 runs=${3:-200} sizes=${4:-1} servers=${5:-spares}
rounds=${ROUNDS:-3}
base=${GSAAS_BENCH_COMPARE_DIR:-/var/tmp/gsaas-bench-compare}
mkdir -p "$base"

# Builds commit $1's agent and elastic bench in its own worktree; prints the worktree.
build() {
  local sha dir
  sha=$(git rev-parse --short=12 "$1^{commit}")
  dir=$base/$sha
  [ -d "$dir" ] || git worktree add --detach "$dir" "$sha" >&2
  echo "bench-elastic-compare: building $1 ($sha)" >&2
  (cd "$dir" && cargo build --release -p rodvr-agent --locked >&2 &&
    cargo bench -p gsaasd --bench elastic --locked --no-run >&2 2>"$base/build-elastic-$sha.log")
  echo "$dir"
}

run() {
  local label=$1 dir=$2 bin
  bin=$(ls -t "$dir"/target/release/deps/elastic-* | grep -v '\.d$' | head -1)
  echo "=== $label"
  (cd "$dir/api" && RODVR_AGENT="$dir/target/release/rodvr-agent" "$bin" "$runs" "$sizes" "$servers" --bench)
}

old_dir=$(build "$old")
new_dir=$(build "$new")
for round in $(seq "$rounds"); do
  run "round $round: $old" "$old_dir"
  run "round $round: $new" "$new_dir"
done
