#!/usr/bin/env bash
# Builds gsaasd and rodvr-agent of an earlier commit of this repository (the upgrade test's
# "previous version"), once per commit, and prints the directory that holds the two binaries.
#
#   scripts/build-previous.sh [COMMIT]     (default: the commit in tests/previous-version)
#
# The source is `git archive`d from this clone's history into target/previous/<commit>/src and
# built there with a target directory of its own (its binaries must never replace this version's
# in target/debug). Not with this version's build directory either: cargo names a workspace's own
# crates by their path inside the workspace, the same in both versions, so each build would
# overwrite the other's (tried: both then rebuilt). A finished build leaves a stamp; a later call
# only prints the path. Callers at once take turns (a lock), so a build started early (test.sh
# starts one in the background) is waited for, not repeated.
set -euo pipefail
cd "$(dirname "$0")/.."

commit=${1:-$(grep -v '^#' tests/previous-version | head -n 1 | tr -d '[:space:]')}
full=$(git rev-parse --verify --quiet "$commit^{commit}") || {
  echo "build-previous.sh: $commit is not a commit of this clone (a shallow clone lacks the history: git fetch --unshallow)" >&2
  exit 1
}
target=${CARGO_TARGET_DIR:-$PWD/target}
root=$target/previous/${full:0:12}
bin=$root/target/debug
mkdir -p "$target/previous"
exec 9>"$target/previous/lock"
flock 9
if [ -f "$root/built" ] && [ -x "$bin/gsaasd" ] && [ -x "$bin/rodvr-agent" ]; then
  echo "$bin"
  exit 0
fi
rm -rf "$root"
mkdir -p "$root/src"
git archive "$full" | tar -x -C "$root/src"
echo "build-previous.sh: building gsaasd and rodvr-agent of ${full:0:12} (once; a few minutes)" >&2
(
  cd "$root/src"
  # Stamped with its commit: infra/build.rs would otherwise ask git, which answers for this clone.
  GSAAS_BUILD_COMMIT=$full CARGO_TARGET_DIR=$root/target \
    cargo build -q --locked -p gsaasd -p rodvr-agent --bins >&2
)
touch "$root/built"
echo "$bin"
