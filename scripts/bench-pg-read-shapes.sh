#!/usr/bin/env bash
# The shapes of gsaasd's read of VMs by id, timed on PostgreSQL alone: a scratch cluster with this
# checkout's migrations, 6,000 VMs (2,000 live, one cGPU each), and `pgbench -M prepared`, one
# client, 4 random live VMs per statement, ROUNDS (default 2) rounds of 4 s per shape.
#
#   scripts/bench-pg-read-shapes.sh
#
# Run as root (the cluster runs as the `postgres` user, on port 5499, in a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
ROUNDS=${ROUNDS:-2}
work=$(mktemp -d /tmp/gsaas-read-shapes.XXXXXX)
chown postgres "$work"
stop() { su postgres -c "$PG_BIN/pg_ctl -D $work/data stop -m fast" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap stop EXIT
su postgres -c "$PG_BIN/initdb -D $work/data -U postgres -A trust" >/dev/null
su postgres -c "$PG_BIN/pg_ctl -D $work/data -l $work/log -w start \
  -o '-p 5499 -k $work -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off'" >/dev/null
psql=("$PG_BIN/psql" -h 127.0.0.1 -p 5499 -U postgres -q -v ON_ERROR_STOP=1)
for migration in migrations/0*.sql; do
  "${psql[@]}" -f "$migration" >/dev/null
done
"${psql[@]}" <<'EOF'
INSERT INTO hosts (name, seq, kind, state, last_seen_ms) VALUES ('h1', 1, 'compute-gpu', 'up', 0);
INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, rcuda_gpu_number)
  SELECT 'h1/' || i, 'h1', i, 'Tesla', 8192, '10.0.0.1', 8308, i FROM generate_series(0, 3) i;
INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, created_ms,
    updated_ms, server_id, host, fixed_ip, tap, routes_on)
  SELECT 'vm' || lpad(i::text, 6, '0'), 'alpha', 'u', 'n' || i, '{}', 'best-fit',
    CASE WHEN i % 3 = 0 THEN 'ready' ELSE 'deleted' END, 'done', '{}', i, i, 's' || i, 'h1',
    '10.1.0.1', 'tap' || i, CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END
  FROM generate_series(1, 6000) i;
INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port)
  SELECT 'vm' || lpad(i::text, 6, '0'), 0, 'h1/' || (i % 4), 100, 'shared', '100.127.0.1', 8308
  FROM generate_series(1, 6000) i WHERE i % 3 = 0;
VACUUM ANALYZE;
EOF

vm_columns="v.id, v.project, v.owner, v.name, v.request, v.policy, v.state, v.error, v.step, \
v.server_id, v.host, v.fixed_ip, v.tap, v.routes_on, v.timings, v.created_ms, v.updated_ms, \
v.version, v.extras_version"
listed="c.seq || ' ' || c.idx || ' ' || c.gpu || ' ' || g.host || ' ' || c.memory_mib || ' ' \
|| c.mode || ' ' || c.masked_address || ' ' || c.masked_port || ' ' || g.rcuda_address || ' ' \
|| g.rcuda_port || ' ' || g.rcuda_gpu_number || ' ' || c.state"
pick='\set a random(1, 2000)
\set b random(1, 2000)
\set c random(1, 2000)
\set d random(1, 2000)'
id() { echo "'vm' || lpad((:$1 * 3)::text, 6, '0')"; }
# held: the cGPUs' version the reader holds (0, the seeded one, skips the aggregate).
wanted() { echo "VALUES ($(id a), $1::bigint), ($(id b), $1::bigint), ($(id c), $1::bigint), ($(id d), $1::bigint)"; }
cgpus="CASE WHEN v.cgpus_version = k.held THEN NULL ELSE (SELECT string_agg($listed, ',') \
FROM cgpus c JOIN gpus g ON g.id = c.gpu WHERE c.vm = v.id) END"
extras="CAST(CASE WHEN EXISTS (SELECT 1 FROM queue q WHERE q.vm = v.id) \
OR EXISTS (SELECT 1 FROM vm_events e WHERE e.vm = v.id) THEN 1 ELSE 0 END AS BIGINT)"
shape() {
  printf '%s\n%s\n' "$pick" "$2" >"$work/$1.sql"
}
shape held "WITH k (id, held) AS ($(wanted 0)) SELECT $vm_columns, v.cgpus_version, $cgpus, $extras FROM k CROSS JOIN vms v WHERE v.id = k.id;"
shape listed "WITH k (id, held) AS ($(wanted 1)) SELECT $vm_columns, v.cgpus_version, $cgpus, $extras FROM k CROSS JOIN vms v WHERE v.id = k.id;"
shape no_exists "WITH k (id, held) AS ($(wanted 0)) SELECT $vm_columns, v.cgpus_version, $cgpus FROM k CROSS JOIN vms v WHERE v.id = k.id;"
shape vm_columns "SELECT $vm_columns FROM vms v WHERE v.id IN ($(id a), $(id b), $(id c), $(id d));"

echo "| shape | statements/s per round |"
echo "|---|---|"
declare -A rates
for _ in $(seq "$ROUNDS"); do
  for s in held listed no_exists vm_columns; do
    tps=$("$PG_BIN/pgbench" -h 127.0.0.1 -p 5499 -U postgres -n -M prepared -T 4 -f "$work/$s.sql" postgres \
      | awk '/^tps/ {printf "%d", $3}')
    rates[$s]="${rates[$s]:-}${rates[$s]:+ / }$tps"
  done
done
for s in held listed no_exists vm_columns; do
  echo "| $s | ${rates[$s]} |"
done
