#!/usr/bin/env bash
# gpu-share/test.sh: build libgsaas-share.so, the stand-in driver and the tests, then run every
# case against the stand-in (no GPU needed). Needs gcc (cc) and make only. The last line is
# always "N passed, M failed"; the exit status is non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# The harness makes its own temporary directory under this one and removes it; this one is
# removed whatever happens.
work="$(mktemp -d "${TMPDIR:-/tmp}/gsaas-share-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if ! make --no-print-directory >"$work/make.log" 2>&1; then
    cat "$work/make.log"
    echo "build failed"
    echo "0 passed, 1 failed"
    exit 1
fi

status=0
TMPDIR="$work" ./build/tests/share_test "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 1 ]; then
    # the harness itself died before printing its summary
    echo "test harness exited with status $status"
    echo "0 passed, 1 failed"
fi
exit "$status"
