#!/usr/bin/env bash
# A real OpenStack control plane on 127.0.0.1 for gsaasd's end-to-end tests and the Table 5.5 bench:
# Keystone, Placement, Glance and Nova (api, conductor, scheduler and two nova-compute services with
# Nova's fake virt driver, hosts gpu-host-1 and rgpu-host-1) on PostgreSQL 15 and RabbitMQ. Only
# Neutron is a stand-in (scripts/openstack-dev/neutron.py): there is no network to wire.
#
#   scripts/openstack-dev.sh start    # installs what is missing, starts, prints the clouds.yaml path
#                                     # (the only line on stdout)
#   scripts/openstack-dev.sh status   # exit 0 when every process is up and Keystone answers
#   scripts/openstack-dev.sh stop     # stops everything and removes the state directory
#
# clouds.yaml has four clouds: gsaas-service (user admin, role admin: gsaasd's service user),
# alpha and beta (a member of project alpha / beta: tenants), alpha-reader (Keystone's reader role
# in alpha only); Keystone's catalog has gsaasd (type gpu-scheduling) at 127.0.0.1:$P_GSAAS of
# ports.env, where the tests that find it there serve one. Each compute host is an availability
# zone of its own (gsaas-<host>); beta owns a private image (gsaas-beta-private) and, in the
# Neutron stand-in, a network (beta-net), as alpha owns alpha-net. Run as root: PostgreSQL runs as user
# postgres, and apt-get installs what is missing.
#
# Environment:
#   GSAAS_OPENSTACK_HOME   install cache (the Python venv, about 500 MB), default /var/tmp/gsaas-openstack
#   GSAAS_OPENSTACK_STATE  state directory (databases, configs, logs, pids), default $GSAAS_OPENSTACK_HOME/run
#   GSAAS_OPENSTACK_WAIT   seconds each start-up wait may take, default 120
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OS_HOME=${GSAAS_OPENSTACK_HOME:-/var/tmp/gsaas-openstack}
STATE=${GSAAS_OPENSTACK_STATE:-$OS_HOME/run}
WAIT=${GSAAS_OPENSTACK_WAIT:-120}
VENV=$OS_HOME/venv
LOGS=$STATE/logs
PIDS=$STATE/pids
PG_BIN=/usr/lib/postgresql/15/bin
# The versions this script was checked with (Nova 34 = 2026.2); a different set rebuilds the venv.
REQUIREMENTS="nova==34.0.0 keystone==30.0.0 openstack-placement==16.0.0 glance==33.0.0 uwsgi==2.0.31 psycopg2-binary==2.9.13"
COMPUTE_HOSTS=(gpu-host-1 rgpu-host-1)
IMAGE_NAME=gsaas-tiny
FLAVOR_NAME=gsaas.tiny

die() {
  echo "openstack-dev.sh: $*" >&2
  exit 1
}

# Fails with the log to read when a start-up step does not finish.
fail_with_log() {
  local what=$1 log=$2
  echo "openstack-dev.sh: $what" >&2
  if [ -f "$log" ]; then
    echo "--- last lines of $log:" >&2
    tail -n 20 "$log" >&2
  fi
  # A broker under a resource alarm blocks every publisher (the services then wait silently): say
  # which alarm, and how much disk is left (RabbitMQ blocks below 50 MB free by default).
  if [ -d "$STATE/rabbit/log" ] && grep -h -i 'alarm' "$STATE"/rabbit/log/*.log 2>/dev/null | tail -n 5 | grep -q .; then
    echo "--- RabbitMQ's resource alarms:" >&2
    grep -h -i 'alarm' "$STATE"/rabbit/log/*.log | tail -n 5 >&2
  fi
  echo "openstack-dev.sh: free disk where the cloud keeps its state: $(df -h --output=avail "$STATE" 2>/dev/null | tail -n 1)" >&2
  echo "openstack-dev.sh: logs are in $LOGS; 'scripts/openstack-dev.sh stop' cleans up" >&2
  exit 1
}

# ---------- install ----------

install_packages() {
  local need=()
  command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
  [ -x $PG_BIN/postgres ] || need+=(postgresql-15)
  command -v psql >/dev/null 2>&1 || need+=(postgresql-client-15)
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq-server)
  [ -x /usr/bin/python3 ] || need+=(python3)
  /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
  # uwsgi has no wheel: pip compiles it against Python's headers.
  [ -n "$(find /usr/include -maxdepth 2 -name Python.h -path '*python3*' 2>/dev/null | head -n 1)" ] ||
    need+=(python3-dev)
  command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing ${need[*]}; run as root so apt-get can install them"
  echo "openstack-dev.sh: installing ${need[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  # stdout is kept for the clouds.yaml path alone.
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${need[@]}" >&2
  # The package starts a system-wide rabbitmq where systemd/invoke-rc.d allow it; this script runs
  # its own broker on its own ports and does not need that one.
}

install_venv() {
  if [ -x "$VENV/bin/uwsgi" ] && [ "$(cat "$VENV/.gsaas-requirements" 2>/dev/null)" = "$REQUIREMENTS" ]; then
    return 0
  fi
  echo "openstack-dev.sh: installing Nova, Keystone, Placement and Glance into $VENV (a few minutes)" >&2
  rm -rf "$VENV"
  mkdir -p "$OS_HOME"
  # Debian's python3, not whatever `python3` is first on PATH (pyenv, conda): the venv must outlive
  # the shell that made it.
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip >"$OS_HOME/pip.log" 2>&1 ||
    { cat "$OS_HOME/pip.log" >&2; die "pip upgrade failed (log: $OS_HOME/pip.log)"; }
  # uwsgi's build links the first python3-config on PATH: a pyenv one would leave uwsgi with the
  # wrong libpython (no `_socket` at run time), so PATH is the venv's and the system's only, and no
  # wheel cached by an earlier build with another PATH is reused.
  # shellcheck disable=SC2086 # one word per requirement
  PATH=$VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin "$VENV/bin/pip" install -q --no-cache-dir \
    --disable-pip-version-check $REQUIREMENTS >>"$OS_HOME/pip.log" 2>&1 ||
    { tail -n 30 "$OS_HOME/pip.log" >&2; die "pip install failed (log: $OS_HOME/pip.log)"; }
  echo "$REQUIREMENTS" >"$VENV/.gsaas-requirements"
}

# ---------- processes ----------

# Starts NAME in its own session (so `stop` can signal its whole process group) and records its pid.
spawn() {
  local name=$1
  shift
  setsid "$@" >"$LOGS/$name.out" 2>&1 </dev/null &
  echo $! >"$PIDS/$name"
}

alive() {
  local f=$PIDS/$1
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# Waits (bounded) for a TCP listener on 127.0.0.1:PORT; NAME's process must stay alive meanwhile.
wait_port() {
  local name=$1 port=$2 deadline=$((SECONDS + WAIT))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    alive "$name" || fail_with_log "$name exited before listening on 127.0.0.1:$port" "$LOGS/$name.out"
    [ $SECONDS -lt $deadline ] ||
      fail_with_log "$name is not listening on 127.0.0.1:$port after ${WAIT}s" "$LOGS/$name.out"
    sleep 0.2
  done
}

sql() {
  PGCONNECT_TIMEOUT=3 psql -X -q -tA -h 127.0.0.1 -p "$P_PG" -U postgres "$@"
}

# Waits (bounded) until the SQL query QUERY on DB prints EXPECTED.
wait_sql() {
  local what=$1 db=$2 query=$3 expected=$4 log=$5 deadline=$((SECONDS + WAIT))
  until [ "$(sql -d "$db" -c "$query" 2>/dev/null || true)" = "$expected" ]; do
    [ $SECONDS -lt $deadline ] || fail_with_log "$what: not done after ${WAIT}s" "$log"
    sleep 0.25
  done
}

# Waits (bounded) for a background job; its output is in LOG.
wait_job() {
  local what=$1 pid=$2 log=$3
  wait "$pid" || fail_with_log "$what failed" "$log"
}

# N free TCP ports on 127.0.0.1 (bound together, so they differ, then released for the services).
free_ports() {
  /usr/bin/python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# ---------- configuration ----------

# keystone_authtoken-style credentials of a service user of project `service`.
service_auth() {
  cat <<EOF
auth_url = $KEYSTONE_URL
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = $1
password = $SERVICE_PASSWORD
EOF
}

write_configs() {
  local db="postgresql+psycopg2://postgres@127.0.0.1:$P_PG"
  mkdir -p "$STATE"/etc/{keystone,placement,glance,nova} "$STATE"/data/{images,glance-staging,glance-tasks,locks}
  cat >"$STATE/etc/keystone/keystone.conf" <<EOF
[DEFAULT]
log_file = $LOGS/keystone.log
[database]
connection = $db/keystone
[token]
provider = fernet
[fernet_tokens]
key_repository = $STATE/etc/keystone/fernet-keys
[fernet_receipts]
key_repository = $STATE/etc/keystone/fernet-keys
[credential]
key_repository = $STATE/etc/keystone/credential-keys
EOF
  cat >"$STATE/etc/placement/placement.conf" <<EOF
[DEFAULT]
log_file = $LOGS/placement.log
[placement_database]
connection = $db/placement
[api]
auth_strategy = keystone
[keystone_authtoken]
www_authenticate_uri = $KEYSTONE_URL
$(service_auth placement)
EOF
  cp "$VENV/etc/glance/glance-api-paste.ini" "$STATE/etc/glance/"
  cat >"$STATE/etc/glance/glance-api.conf" <<EOF
[DEFAULT]
log_file = $LOGS/glance.log
enabled_backends = fs:file
[glance_store]
default_backend = fs
[fs]
filesystem_store_datadir = $STATE/data/images
[os_glance_staging_store]
filesystem_store_datadir = $STATE/data/glance-staging
[os_glance_tasks_store]
filesystem_store_datadir = $STATE/data/glance-tasks
[database]
connection = $db/glance
[paste_deploy]
flavor = keystone
[keystone_authtoken]
www_authenticate_uri = $KEYSTONE_URL
$(service_auth glance)
EOF
  cp "$VENV/etc/nova/api-paste.ini" "$STATE/etc/nova/"
  # One nova.conf for every Nova service; each nova-compute adds its own host and state_path (the
  # fake driver names its node after the host; the node's uuid file lives in state_path).
  cat >"$STATE/etc/nova/nova.conf" <<EOF
[DEFAULT]
log_dir = $LOGS
transport_url = rabbit://guest:guest@127.0.0.1:$P_AMQP/
compute_driver = fake.FakeDriver
state_path = $STATE/data/nova
my_ip = 127.0.0.1
host = gsaas-controller
# Nothing here changes behind Nova's back: no periodic cache healing or usage audits.
heal_instance_info_cache_interval = -1
instance_usage_audit = false
[api]
auth_strategy = keystone
[api_database]
connection = $db/nova_api
[database]
connection = $db/nova
[conductor]
workers = 1
[scheduler]
workers = 1
[quota]
# Tests and the bench boot more servers than the default quota (10 instances) allows.
driver = nova.quota.NoopQuotaDriver
[keystone_authtoken]
www_authenticate_uri = $KEYSTONE_URL
$(service_auth nova)
[service_user]
send_service_user_token = true
$(service_auth nova)
[placement]
region_name = RegionOne
$(service_auth nova)
[glance]
region_name = RegionOne
[neutron]
endpoint_override = http://127.0.0.1:$P_NEUTRON
region_name = RegionOne
$(service_auth nova)
[oslo_concurrency]
lock_path = $STATE/data/locks
EOF
  # nova-api under uwsgi logs to one file (log_dir would give every worker the same name anyway).
  printf '[DEFAULT]\nlog_dir =\nlog_file = %s/nova-api.log\n' "$LOGS" >"$STATE/etc/nova/nova-api.conf"
  local host
  for host in "${COMPUTE_HOSTS[@]}"; do
    mkdir -p "$STATE/data/nova-$host"
    printf '[DEFAULT]\nhost = %s\nstate_path = %s\nlog_dir =\nlog_file = %s/nova-compute-%s.log\n' \
      "$host" "$STATE/data/nova-$host" "$LOGS" "$host" >"$STATE/etc/nova/compute-$host.conf"
  done
}

# A web service under uwsgi: NAME PORT MODULE [ENV=VALUE...]. "Connection: close" because reused
# keep-alive connections to uwsgi's http-socket get reset under load.
spawn_uwsgi() {
  local name=$1 port=$2 module=$3
  shift 3
  local envs=() e
  for e in "$@"; do envs+=(--env "$e"); done
  spawn "$name" "$VENV/bin/uwsgi" --http-socket "127.0.0.1:$port" --module "$module" --home "$VENV" \
    --master --processes 1 --threads 8 --enable-threads --lazy-apps --need-app --die-on-term \
    --buffer-size 65535 --add-header "Connection: close" --procname-prefix "gsaas-os-$name-" "${envs[@]}"
}

provision() {
  GSAAS_OS_AUTH_URL=$KEYSTONE_URL GSAAS_OS_ADMIN_PASSWORD=$ADMIN_PASSWORD \
    GSAAS_OS_SERVICE_PASSWORD=$SERVICE_PASSWORD GSAAS_OS_ALPHA_PASSWORD=$ALPHA_PASSWORD \
    GSAAS_OS_READER_PASSWORD=$READER_PASSWORD \
    GSAAS_OS_BETA_PASSWORD=$BETA_PASSWORD GSAAS_OS_NOVA_URL="http://127.0.0.1:$P_NOVA/v2.1" \
    GSAAS_OS_PLACEMENT_URL="http://127.0.0.1:$P_PLACEMENT" GSAAS_OS_GLANCE_URL="http://127.0.0.1:$P_GLANCE" \
    GSAAS_OS_NEUTRON_URL="http://127.0.0.1:$P_NEUTRON" GSAAS_OS_GSAAS_URL="http://127.0.0.1:$P_GSAAS" \
    GSAAS_OS_IMAGE_NAME=$IMAGE_NAME \
    GSAAS_OS_IMAGE_FILE="$STATE/data/$IMAGE_NAME.img" GSAAS_OS_FLAVOR_NAME=$FLAVOR_NAME \
    GSAAS_OS_COMPUTE_HOSTS="${COMPUTE_HOSTS[*]}" \
    "$VENV/bin/python" "$HERE/openstack-dev/provision.py" "$1" >>"$LOGS/provision.out" 2>&1 ||
    fail_with_log "provisioning ($1) failed" "$LOGS/provision.out"
}

write_clouds_yaml() {
  local cloud user project password
  {
    echo "# Written by scripts/openstack-dev.sh start; removed by stop."
    echo "clouds:"
    for cloud in gsaas-service alpha beta alpha-reader; do
      case $cloud in
        gsaas-service) user=admin project=admin password=$ADMIN_PASSWORD ;;
        alpha) user=alpha-member project=alpha password=$ALPHA_PASSWORD ;;
        beta) user=beta-member project=beta password=$BETA_PASSWORD ;;
        alpha-reader) user=alpha-reader project=alpha password=$READER_PASSWORD ;;
      esac
      cat <<EOF
  $cloud:
    region_name: RegionOne
    interface: public
    identity_api_version: 3
    auth:
      auth_url: $KEYSTONE_URL
      username: $user
      password: $password
      project_name: $project
      user_domain_name: Default
      project_domain_name: Default
EOF
    done
  } >"$STATE/clouds.yaml.tmp"
  mv "$STATE/clouds.yaml.tmp" "$STATE/clouds.yaml"
}

# ---------- commands ----------

# Every process `start` records (its pid file's name).
ALL=(postgres epmd rabbit keystone neutron placement glance nova-conductor nova-scheduler nova-api)
for host in "${COMPUTE_HOSTS[@]}"; do ALL+=("nova-compute-$host"); done

status() {
  [ -f "$STATE/clouds.yaml" ] && [ -f "$STATE/ports.env" ] || return 1
  # shellcheck source=/dev/null
  . "$STATE/ports.env"
  local name down=()
  for name in "${ALL[@]}"; do alive "$name" || down+=("$name"); done
  if [ ${#down[@]} -gt 0 ]; then
    echo "openstack-dev.sh: not running: ${down[*]} (logs: $LOGS)" >&2
    return 1
  fi
  (exec 3<>"/dev/tcp/127.0.0.1/$P_KEYSTONE") 2>/dev/null || return 1
}

stop_one() {
  local name=$1 signal=${2:-TERM} pid
  [ -f "$PIDS/$name" ] || return 0
  pid=$(cat "$PIDS/$name")
  kill -"$signal" -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  # Still there after 15 s: the whole group goes.
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$PIDS/$name"
}

stop() {
  [ -d "$STATE" ] || return 0
  local name
  # Nova and the web services first (together), while the broker is still there: nova-compute
  # hangs on shutdown when RabbitMQ goes first. The web services under uwsgi get SIGINT, which ends
  # their workers at once: on SIGTERM uwsgi waits for them, and nova-api's outlived the 15 s
  # bound. Then the broker (and its epmd) and PostgreSQL together (SIGINT: its fast shutdown).
  for name in "${ALL[@]}"; do
    case $name in
      rabbit | epmd | postgres) ;;
      keystone | placement | glance | nova-api) stop_one "$name" INT & ;;
      *) stop_one "$name" & ;;
    esac
  done
  wait
  { stop_one rabbit && stop_one epmd; } &
  stop_one postgres INT &
  wait
  rm -rf "$STATE"
}

start() {
  if status 2>/dev/null; then
    echo "openstack-dev.sh: already running" >&2
    echo "$STATE/clouds.yaml"
    return 0
  fi
  # PostgreSQL runs as user postgres (setpriv), and apt-get may have to install things.
  [ "$(id -u)" -eq 0 ] || die "start must run as root"
  install_packages
  install_venv
  # Leftovers of a failed or interrupted start: cleaned before starting again.
  stop
  mkdir -p "$LOGS" "$PIDS"
  local t0=$SECONDS var
  # P_GSAAS: not a service of this script's, but where the catalog says gsaasd is (the tests
  # that find gsaasd through the catalog serve one there, one at a time).
  read -r P_PG P_AMQP P_DIST P_EPMD P_KEYSTONE P_PLACEMENT P_GLANCE P_NOVA P_NEUTRON P_GSAAS <<<"$(free_ports 10)"
  KEYSTONE_URL="http://127.0.0.1:$P_KEYSTONE/v3"
  # Fresh secrets for every start; clouds.yaml carries the ones the tests need.
  secret() { /usr/bin/python3 -c 'import secrets; print(secrets.token_hex(12))'; }
  ADMIN_PASSWORD=$(secret) SERVICE_PASSWORD=$(secret) ALPHA_PASSWORD=$(secret) BETA_PASSWORD=$(secret)
  READER_PASSWORD=$(secret)
  for var in P_PG P_AMQP P_DIST P_EPMD P_KEYSTONE P_PLACEMENT P_GLANCE P_NOVA P_NEUTRON P_GSAAS KEYSTONE_URL; do
    echo "$var=${!var}"
  done >"$STATE/ports.env"
  chmod 600 "$STATE/ports.env"

  # PostgreSQL: trust auth on loopback only, durability off (throwaway data).
  mkdir -p "$STATE/pg"
  chown postgres: "$STATE/pg"
  local as_postgres=(setpriv --reuid postgres --regid postgres --init-groups)
  "${as_postgres[@]}" $PG_BIN/initdb -D "$STATE/pg/data" -A trust -U postgres >"$LOGS/initdb.out" 2>&1 ||
    fail_with_log "initdb failed" "$LOGS/initdb.out"
  spawn postgres "${as_postgres[@]}" $PG_BIN/postgres -D "$STATE/pg/data" -h 127.0.0.1 -p "$P_PG" \
    -k "$STATE/pg" -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300

  # RabbitMQ: its own epmd and node on loopback ports. The listener is set in rabbitmq.conf; the
  # RABBITMQ_NODE_IP_ADDRESS/PORT variables end in eaddrinuse with this version.
  mkdir -p "$STATE"/rabbit/{mnesia,log,home}
  echo '[].' >"$STATE/rabbit/enabled_plugins"
  printf 'loopback_users = none\nlisteners.tcp.1 = 127.0.0.1:%s\n' "$P_AMQP" >"$STATE/rabbit/rabbitmq.conf"
  local epmds=(/usr/lib/erlang/erts-*/bin/epmd)
  local epmd=${epmds[0]}
  [ -x "$epmd" ] || die "no epmd under /usr/lib/erlang (is erlang-base installed?)"
  (
    export HOME=$STATE/rabbit/home RABBITMQ_NODENAME=gsaas@localhost RABBITMQ_DIST_PORT=$P_DIST
    export ERL_EPMD_PORT=$P_EPMD ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE=$STATE/rabbit/mnesia
    export RABBITMQ_LOG_BASE=$STATE/rabbit/log RABBITMQ_ENABLED_PLUGINS_FILE=$STATE/rabbit/enabled_plugins
    export RABBITMQ_CONFIG_FILE=$STATE/rabbit/rabbitmq RABBITMQ_PID_FILE=$STATE/rabbit/pid
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    spawn epmd "$epmd" -address 127.0.0.1 -port "$P_EPMD"
    wait_port epmd "$P_EPMD"
    spawn rabbit /usr/lib/rabbitmq/bin/rabbitmq-server
  )

  write_configs
  wait_port postgres "$P_PG"
  local db
  for db in keystone placement glance nova_api nova nova_cell0; do
    sql -c "create database $db" >/dev/null 2>&1 || fail_with_log "cannot create database $db" "$LOGS/postgres.out"
  done

  # Schemas: Nova's (the slowest) and Placement's + Glance's in the background while Keystone's is
  # made and bootstrapped.
  local nova_manage=("$VENV/bin/nova-manage" --config-file "$STATE/etc/nova/nova.conf") nova_db other_db
  {
    "${nova_manage[@]}" api_db sync &&
      "${nova_manage[@]}" cell_v2 map_cell0 --database_connection "postgresql+psycopg2://postgres@127.0.0.1:$P_PG/nova_cell0" &&
      "${nova_manage[@]}" cell_v2 create_cell --name cell1 && "${nova_manage[@]}" db sync
  } >"$LOGS/nova-db.out" 2>&1 &
  nova_db=$!
  {
    "$VENV/bin/placement-manage" --config-dir "$STATE/etc/placement" db sync &&
      "$VENV/bin/glance-manage" --config-dir "$STATE/etc/glance" db_sync
  } >"$LOGS/placement-glance-db.out" 2>&1 &
  other_db=$!
  local keystone_manage=("$VENV/bin/keystone-manage" --config-file "$STATE/etc/keystone/keystone.conf")
  {
    "${keystone_manage[@]}" db_sync &&
      "${keystone_manage[@]}" fernet_setup --keystone-user root --keystone-group root &&
      "${keystone_manage[@]}" credential_setup --keystone-user root --keystone-group root &&
      "${keystone_manage[@]}" bootstrap --bootstrap-password "$ADMIN_PASSWORD" \
        --bootstrap-region-id RegionOne --bootstrap-admin-url "$KEYSTONE_URL" \
        --bootstrap-public-url "$KEYSTONE_URL" --bootstrap-internal-url "$KEYSTONE_URL"
  } >"$LOGS/keystone-db.out" 2>&1 || fail_with_log "Keystone's database set-up failed" "$LOGS/keystone-db.out"

  spawn_uwsgi keystone "$P_KEYSTONE" keystone.wsgi.api:application \
    "OS_KEYSTONE_CONFIG_FILES=$STATE/etc/keystone/keystone.conf"
  GSAAS_OS_AUTH_URL=$KEYSTONE_URL GSAAS_OS_ADMIN_PASSWORD=$ADMIN_PASSWORD \
    spawn neutron "$VENV/bin/python" "$HERE/openstack-dev/neutron.py" "$P_NEUTRON"
  wait_port keystone "$P_KEYSTONE"
  # Service users and the catalog, before any service authenticates.
  provision identity
  wait_job "Placement's / Glance's database set-up" $other_db "$LOGS/placement-glance-db.out"
  spawn_uwsgi placement "$P_PLACEMENT" placement.wsgi.api:application \
    "OS_PLACEMENT_CONFIG_DIR=$STATE/etc/placement"
  spawn_uwsgi glance "$P_GLANCE" glance.wsgi.api:application "OS_GLANCE_CONFIG_DIR=$STATE/etc/glance"
  wait_port rabbit "$P_AMQP"
  wait_job "Nova's database set-up" $nova_db "$LOGS/nova-db.out"
  local service host
  for service in conductor scheduler; do
    spawn "nova-$service" "$VENV/bin/nova-$service" --config-file "$STATE/etc/nova/nova.conf"
  done
  # nova-compute loses 10 s when it calls the conductor before the conductor consumes its queue:
  # wait for the conductor's service row first.
  wait_sql "nova-conductor registering" nova \
    "select count(*) from services where \"binary\" = 'nova-conductor'" 1 "$LOGS/nova-conductor.log"
  for host in "${COMPUTE_HOSTS[@]}"; do
    spawn "nova-compute-$host" "$VENV/bin/nova-compute" --config-file "$STATE/etc/nova/nova.conf" \
      --config-file "$STATE/etc/nova/compute-$host.conf"
  done
  spawn_uwsgi nova-api "$P_NOVA" nova.wsgi.osapi_compute:application "OS_NOVA_CONFIG_DIR=$STATE/etc/nova" \
    "OS_NOVA_CONFIG_FILES=api-paste.ini;nova.conf;nova-api.conf"
  wait_port neutron "$P_NEUTRON"
  wait_port placement "$P_PLACEMENT"
  wait_port glance "$P_GLANCE"
  wait_port nova-api "$P_NOVA"
  head -c 1048576 /dev/zero >"$STATE/data/$IMAGE_NAME.img"
  provision content
  # Both hosts schedulable: each compute node has its row and its Placement inventory, then the
  # cell knows its hosts.
  wait_sql "the nova-compute services registering" nova "select count(*) from compute_nodes" \
    ${#COMPUTE_HOSTS[@]} "$LOGS/nova-compute-${COMPUTE_HOSTS[0]}.log"
  wait_sql "the compute nodes' inventories in Placement" placement \
    "select count(distinct resource_provider_id) from inventories" ${#COMPUTE_HOSTS[@]} "$LOGS/placement.log"
  "${nova_manage[@]}" cell_v2 discover_hosts >"$LOGS/discover-hosts.out" 2>&1 ||
    fail_with_log "nova-manage cell_v2 discover_hosts failed" "$LOGS/discover-hosts.out"
  wait_sql "the host mappings" nova_api "select count(*) from host_mappings" ${#COMPUTE_HOSTS[@]} \
    "$LOGS/discover-hosts.out"
  # An availability zone per compute host (gsaas-<host>): where tenants' VMs of locality local
  # (and, on the one rGPU host, remote) go, since tenants may not name hosts.
  provision zones
  write_clouds_yaml
  echo "openstack-dev.sh: OpenStack up in $((SECONDS - t0)) s: Keystone $KEYSTONE_URL, compute hosts ${COMPUTE_HOSTS[*]}, logs in $LOGS" >&2
  echo "$STATE/clouds.yaml"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status)
    if status; then
      echo "openstack-dev.sh: running; clouds.yaml: $STATE/clouds.yaml"
    else
      echo "openstack-dev.sh: not running"
      exit 1
    fi
    ;;
  *) die "usage: $0 start|stop|status" ;;
esac
