#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need, then runs every test.
# The network tests build namespaces and nftables rules on the real kernel, and the storage tests
# start throwaway PostgreSQL 15 servers as user postgres, so run it as root.
set -euo pipefail
cd "$(dirname "$0")/.."

# A build and the suite's services take several GiB; RabbitMQ and PostgreSQL stop accepting writes
# on a nearly full disk, which shows up far from its cause.
free_kib=$(df -k --output=avail . | tail -n 1 | tr -d ' ')
if [ "${free_kib:-0}" -lt $((8 * 1024 * 1024)) ]; then
  echo "scripts/test.sh: warning: only $((free_kib / 1024)) MiB free on this disk; the build and the" \
    "test services need about 8 GiB (brokers block, databases stop writing when it runs out)" >&2
fi

need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
# gpu-share/ (the memory interposer the agent preloads into the GPU servers it runs) is C.
command -v make >/dev/null 2>&1 || need+=(make)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
[ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
# The conformance test runs schemathesis (PyPI) from a venv of its own.
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# The metrics test checks /metrics with promtool (Debian's prometheus package).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The notification tests start throwaway RabbitMQ brokers (Debian's rabbitmq-server).
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq-server)
# reqwest's TLS builds against the system's OpenSSL.
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: missing ${need[*]}; run as root so it can install them with apt-get" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# Set-up that mostly waits runs in the background while the suite builds: the dev OpenStack
# (installed from PyPI the first time), OpenStack's clients' venvs (PyPI) for
# tests/openstack_clients.rs, the deployment check's tools (npm, PyPI), and the upgrade test's
# previous version (scripts/build-previous.sh, at the lowest priority, so it takes the cores only
# when the builds and tests leave them idle). Those scripts take locks, so whatever asks for one
# of them meanwhile waits for it instead of doing it again; the tests start once OpenStack is up.
background=$(mktemp -d)
pids=() openstack= stop_openstack=
# Every process this run starts inherits the marker; at the end, scripts/leftovers.py names (and
# ends) any still running, and the run fails: every script and test ends what it started. (Not a
# GSAAS_* name: gsaasd reads those as its settings, and warns of one it does not know.)
LEFTOVER_CHECK_RUN="$$-$(date +%s%N)"
export LEFTOVER_CHECK_RUN
finish() {
  local status=$?
  # Whatever is still running in the background (this script failed first) ends before the cloud
  # is stopped, so that nothing starts after the stop.
  kill "${pids[@]}" $openstack 2>/dev/null || true
  wait "${pids[@]}" $openstack 2>/dev/null || true
  if [ -n "$stop_openstack" ]; then scripts/openstack-dev.sh stop; fi
  rm -rf "$background"
  if ! python3 scripts/leftovers.py "$LEFTOVER_CHECK_RUN"; then
    echo "scripts/test.sh: the processes above outlived the run that started them" >&2
    [ "$status" -ne 0 ] || status=1
  fi
  exit "$status"
}
trap finish EXIT
for kind in osc horizon cloudkitty ceilometer; do
  scripts/openstack-clients.sh "$kind" >/dev/null 2>"$background/clients-$kind.err" &
  pids+=($!)
done
scripts/check-deploy.sh tools >/dev/null 2>"$background/deploy-tools.err" &
pids+=($!)
nice -n 19 scripts/build-previous.sh >/dev/null 2>"$background/previous.err" &
pids+=($!)
# The real-OpenStack tests (api/tests/openstack.rs) run against scripts/openstack-dev.sh's cloud:
# started here (the first time it also installs it: a few minutes) and stopped on exit, unless it
# was already running (then it is left as it was).
if ! scripts/openstack-dev.sh status >/dev/null 2>&1; then
  stop_openstack=1
  scripts/openstack-dev.sh start >/dev/null 2>"$background/openstack.err" &
  openstack=$!
fi

python3 scripts/leftovers.py --self-test
# No import circle between a crate's modules, no arrow up gsaasd's layers (docs/architecture.md).
python3 scripts/check-modules.py --self-test
python3 scripts/check-modules.py
# docs/architecture.md names only files, types and functions that exist, and check-modules.py's layers.
python3 scripts/check-architecture.py --self-test
python3 scripts/check-architecture.py
# Migrations only expand the schema (docs/upgrades.md), and released ones never change.
python3 scripts/check-migrations.py --self-test
python3 scripts/check-migrations.py
# The host parts (nftables, NVML) stay in the agent binary: gsaasd links only its contract and core.
if cargo tree --locked -p gsaasd -e normal --prefix none | grep -E '^(nftables|nvml-wrapper|rodvr-agent) '; then
  echo "gsaasd links the agent's host parts (above): depend on rodvr-contract / rodvr-core" >&2
  exit 1
fi

# No connection or transaction leaves the datastore crate: gsaasd built on its own (without the
# tests' `testing` feature of gsaas-datastore) reaches the database through Db's and
# PoolChange's methods only, and the compiler refuses anything else (docs/architecture.md). The
# build is the one gpu-check.sh's self-test and check-deploy.sh run later (they find it done), so
# the proof costs no build of its own.
cargo build -q --locked -p gsaasd -p rodvr-agent

# The memory interposer and its stand-in driver: every allocation path refused past its share,
# every sharing call refused (gpu-share/test.sh; the agent's tests below preload it too).
gpu-share/test.sh
# Benches are not run here (they are long and print figures); clippy --all-targets compiles them.
cargo test --workspace --locked --no-run "$@"
if [ -n "$openstack" ]; then
  if ! wait "$openstack"; then
    cat "$background/openstack.err" >&2
    echo "scripts/test.sh: the dev OpenStack did not start (its output above)" >&2
    exit 1
  fi
  cat "$background/openstack.err" >&2
  openstack=
fi
GSAAS_OPENSTACK_CLOUDS=$(scripts/openstack-dev.sh start | tail -n 1)
export GSAAS_OPENSTACK_CLOUDS
cargo test --workspace --locked "$@"
# The background jobs are done (the tests that need them waited for them); one that failed was
# done again by its test, which would have failed otherwise.
wait "${pids[@]}" 2>/dev/null || true
pids=()
# The GPU check's whole path without a GPU (stand-in NVML, a stand-in for LUPINE's server), so the
# script a GPU machine runs is proven first (scripts/gpu-check.sh).
scripts/gpu-check.sh selftest
# The Helm chart, its rendered manifests and config, and the systemd units.
scripts/check-deploy.sh
