#!/usr/bin/env bash
# Builds one bench at two commits and runs the two builds alternately on this machine, so a
# performance claim compares like with like (same machine, same load, same moment).
#
#   scripts/bench-compare.sh OLD NEW BENCH [ARGS...]
#
# OLD and NEW are commits (or WORKTREE for the working tree as it is); BENCH is `crate:bench`
# (`gsaasd:cycles`) or a bench of gsaasd (`cycles`); ARGS go to the bench after `--`.
# ROUNDS (default 3) sets how many times each build runs: OLD, NEW, OLD, NEW, ...
# ALSO="REV ..." adds builds that run after NEW in each round (OLD, NEW, REV..., OLD, ...), each
# announced by its own name, to place several commits in one run.
#
# Each commit is checked out in a worktree of its own under $GSAAS_BENCH_COMPARE_DIR (default
# /var/tmp/gsaas-bench-compare) and built with a target directory of its own: a shared one would mix
# the commits' sources through cargo's dep-info. The folder is outside this checkout because cargo
# reads .cargo/config.toml from every folder above the one it builds in: inside, an old commit
# would be built with today's settings (its SQLite with today's compile options). The first build
# of a commit takes minutes; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 3 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
old=$1 new=$2 bench=$3
shift 3
case $bench in
  *:*) crate=${bench%%:*} bench=${bench#*:} ;;
  *) crate=gsaasd ;;
esac
rounds=${ROUNDS:-3}
root=$PWD
base=${GSAAS_BENCH_COMPARE_DIR:-/var/tmp/gsaas-bench-compare}

# Prints the bench's crate directory and executable, built from commit $1, a tab between.
build() {
  local rev=$1 dir target label
  if [ "$rev" = WORKTREE ]; then
    dir=$root
    target=$root/target
  else
    local sha
    sha=$(git rev-parse --short=12 "$rev^{commit}")
    dir=$base/$sha
    target=$base/target-$sha
    if [ ! -d "$dir" ]; then
      git worktree add --detach "$dir" "$sha" >&2
    fi
  fi
  label=$rev
  echo "bench-compare: building $crate:$bench at $label" >&2
  mkdir -p "$base"
  (cd "$dir" && CARGO_TARGET_DIR=$target cargo bench -p "$crate" --bench "$bench" --locked --no-run \
    --message-format=json 2>"$base/build-$bench.log") |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["manifest_path"].rsplit("/", 1)[0] + "\t" + m["executable"])
' "$bench" | tail -n 1
}

IFS=$'\t' read -r old_dir old_bin <<<"$(build "$old")" || true
IFS=$'\t' read -r new_dir new_bin <<<"$(build "$new")" || true
[ -x "${old_bin:-}" ] || { tail -n 20 "$base/build-$bench.log" >&2; echo "bench-compare: no $bench executable for $old" >&2; exit 1; }
[ -x "${new_bin:-}" ] || { tail -n 20 "$base/build-$bench.log" >&2; echo "bench-compare: no $bench executable for $new" >&2; exit 1; }
read -r -a also <<<"${ALSO:-}"
sides=(old new) dirs=("$old_dir" "$new_dir") bins=("$old_bin" "$new_bin")
for rev in "${also[@]}"; do
  IFS=$'\t' read -r dir bin <<<"$(build "$rev")" || true
  [ -x "${bin:-}" ] || { tail -n 20 "$base/build-$bench.log" >&2; echo "bench-compare: no $bench executable for $rev" >&2; exit 1; }
  sides+=("$rev") dirs+=("$dir") bins+=("$bin")
done

echo "bench-compare: $crate:$bench $* on $(hostname), $(nproc) cores, $(date -u +%FT%TZ)"
echo "  old = $old ($(git rev-parse --short "$old" 2>/dev/null || echo worktree))"
echo "  new = $new ($(git rev-parse --short "$new" 2>/dev/null || echo worktree))"
for rev in "${also[@]}"; do
  echo "  also $rev ($(git rev-parse --short "$rev" 2>/dev/null || echo worktree))"
done
for round in $(seq 1 "$rounds"); do
  for i in "${!sides[@]}"; do
    side=${sides[$i]}
    echo "=== round $round: $side"
    # Benches run from their crate's directory, as cargo bench runs them; criterion's reports go
    # to the build's own folder, not into the checkout.
    home=$base/criterion-$side
    [ "$i" -lt 2 ] || home=$base/criterion-also-$((i - 1))
    (cd "${dirs[$i]}" && CRITERION_HOME="$home" "${bins[$i]}" --bench "$@")
  done
done
