#!/usr/bin/env bash
# OpenStack's own clients for the tests of GSaaS's OpenStack interfaces, each in a virtual
# environment of its own (never the system Python), from the Python package registry, pinned:
#
#   scripts/openstack-clients.sh osc       # python-openstackclient + osc-lib + osc-plugin/ (this repo's)
#   scripts/openstack-clients.sh horizon   # Horizon + horizon-plugin/ (this repo's)
#   scripts/openstack-clients.sh cloudkitty  # CloudKitty (its Prometheus collector, for deploy/cloudkitty)
#   scripts/openstack-clients.sh ceilometer  # Ceilometer (its notification meters, for deploy/ceilometer)
#
# Prints the venv's path (the only line on stdout). Idempotent: a venv whose pins and plugin
# source are unchanged is reused as it is; otherwise it is rebuilt. Calls at once take turns. The
# pins are the top-level packages below; every other package is held by the plugin's
# constraints.txt.
#
# Environment: GSAAS_CLIENTS_HOME (default /var/tmp/gsaas-clients).
set -euo pipefail
cd "$(dirname "$0")/.."
HOME_DIR=${GSAAS_CLIENTS_HOME:-/var/tmp/gsaas-clients}

case ${1:-} in
  osc)
    plugin=osc-plugin
    pins="python-openstackclient==10.5.0 osc-lib==4.7.0"
    ;;
  horizon)
    plugin=horizon-plugin
    pins="horizon==27.0.0"
    ;;
  cloudkitty)
    # No plugin: the configuration in deploy/cloudkitty is what is tested.
    plugin=deploy/cloudkitty
    pins="cloudkitty==25.0.0"
    ;;
  ceilometer)
    # No plugin either: deploy/ceilometer's meter definitions are what is tested.
    plugin=deploy/ceilometer
    pins="ceilometer==25.0.0"
    ;;
  *)
    echo "usage: $0 osc|horizon|cloudkitty|ceilometer" >&2
    exit 2
    ;;
esac

if ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "openstack-clients.sh: python3-venv is missing; run as root so apt-get can install it" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv >&2
fi

venv=$HOME_DIR/$1
# Callers at once take turns (scripts/test.sh builds the venvs in the background while the suite
# builds, and a test may ask for one meanwhile): the second finds the first's venv up to date.
mkdir -p "$HOME_DIR"
exec 9>"$HOME_DIR/$1.lock"
flock 9
# What the venv was built from: the pins, the constraints and the plugin's source.
stamp=$( { echo "$pins"; cat "$plugin/constraints.txt"; find "$plugin" -type f \( -name '*.py' -o -name '*.toml' -o -name '*.html' -o -name '*.txt' \) -not -path '*/build/*' -not -path '*.egg-info/*' -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat; } | sha256sum | cut -d' ' -f1)
if [ -f "$venv/.gsaas-stamp" ] && [ "$(cat "$venv/.gsaas-stamp")" = "$stamp" ]; then
  echo "$venv"
  exit 0
fi
rm -rf "$venv"
mkdir -p "$HOME_DIR"
/usr/bin/python3 -m venv "$venv" >&2
# shellcheck disable=SC2086
"$venv/bin/pip" install --quiet --disable-pip-version-check -c "$plugin/constraints.txt" $pins >&2
# The plugin, built in a scratch copy so the source tree gets no build/ or egg-info.
if [ "$1" != cloudkitty ] && [ "$1" != ceilometer ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cp -r "$plugin" "$scratch/"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$scratch/$plugin" >&2
fi
if [ "$1" = horizon ]; then
  # Installed as Horizon plugins are: the enabled files into openstack_dashboard/local/enabled;
  # then Horizon's static files collected and compressed, as a deployment does, with the
  # settings of horizon-plugin/devserver (the Horizon the tests run).
  dashboard=$("$venv/bin/python" -c 'import openstack_dashboard, os; print(os.path.dirname(openstack_dashboard.__file__))')
  cp "$plugin"/gsaas_dashboard/enabled/_9*_gsaas_*.py "$dashboard/local/enabled/"
  export PYTHONPATH=$PWD/$plugin/devserver DJANGO_SETTINGS_MODULE=gsaas_horizon_settings GSAAS_HORIZON_STATE=$venv/state
  "$venv/bin/python" -W ignore -m django collectstatic --noinput -v0 >&2
  "$venv/bin/python" -W ignore -m django compress --force >&2
fi
echo "$stamp" >"$venv/.gsaas-stamp"
echo "$venv"
