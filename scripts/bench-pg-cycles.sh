#!/usr/bin/env bash
# Where a PostgreSQL cycles run spends its CPU and which statements it runs, for one built cycles
# bench (`cargo bench -p gsaasd --bench cycles --no-run` prints its path; bench-compare.sh keeps
# one per commit under /var/tmp/gsaas-bench-compare).
#
#   scripts/bench-pg-cycles.sh cpu  BENCH_BIN CRATE_DIR [CLIENTS]
#   scripts/bench-pg-cycles.sh sql  BENCH_BIN CRATE_DIR OUT [CLIENTS]
#
# `cpu` runs 12 s at CLIENTS (default 256) and sums, from /proc, the CPU of the bench process
# (gsaasd and its clients) and of every `postgres` process over 4 s of the measured window.
# `sql` runs 10 s at CLIENTS (default 128), switches `log_statement = all` on for 3 s of the
# window (ALTER SYSTEM on the bench's own PostgreSQL, as its superuser), copies the server log
# to OUT and prints the statements counted by shape. CRATE_DIR is the bench's crate directory
# (`api` of the commit's checkout): the bench reads fixtures relative to it. Run as root.
set -euo pipefail

mode=${1:?cpu or sql}
bin=${2:?bench binary}
crate=${3:?crate directory}
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)

cpu_ticks() {
  # Prints the bench's and PostgreSQL's user+system ticks.
  local bench=0 pg=0 stat comm rest
  for stat in /proc/[0-9]*/stat; do
    read -r rest <"$stat" 2>/dev/null || continue
    comm=${rest#*(}
    comm=${comm%%)*}
    rest=${rest##*) }
    # Fields after the name: 12 and 13 are utime and stime.
    set -- $rest
    case "$comm" in
      postgres) pg=$((pg + ${12} + ${13})) ;;
      cycles*) bench=$((bench + ${12} + ${13})) ;;
    esac
  done
  echo "$bench $pg"
}

case "$mode" in
  cpu)
    clients=${4:-256}
    out=$(mktemp)
    (cd "$crate" && "$bin" 12 "$clients" postgres >"$out" 2>&1) &
    sleep 6
    read -r b1 p1 < <(cpu_ticks)
    sleep 4
    read -r b2 p2 < <(cpu_ticks)
    wait
    hz=$(getconf CLK_TCK)
    line=$(grep -E '^\| Postgres' "$out" || true)
    rate=$(echo "$line" | awk -F'|' '{gsub(/ /, "", $7); print $7}')
    rm -f "$out"
    [ -n "$rate" ] || { echo "the bench printed no PostgreSQL row" >&2; exit 1; }
    awk -v b=$((b2 - b1)) -v p=$((p2 - p1)) -v hz="$hz" -v rate="$rate" 'BEGIN {
      cycles = rate * 4
      printf "cycles/s %d; per cycle: bench process %.2f ms, PostgreSQL %.2f ms\n",
        rate, b / hz / cycles * 1000, p / hz / cycles * 1000 }'
    ;;
  sql)
    dest=${4:?output file}
    clients=${5:-128}
    out=$(mktemp)
    (cd "$crate" && "$bin" 10 "$clients" postgres >"$out" 2>&1) &
    sleep 5
    port=$(ss -ltnp | grep '"postgres"' | grep -o '127.0.0.1:[0-9]*' | head -n 1 | cut -d: -f2)
    log=$(ls -t /tmp/gsaas-pg-*/postgres.log | head -n 1)
    psql=("$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -q)
    "${psql[@]}" -c "ALTER SYSTEM SET log_statement = 'all'" -c "SELECT pg_reload_conf()" >/dev/null
    sleep 3
    "${psql[@]}" -c "ALTER SYSTEM SET log_statement = 'none'" -c "SELECT pg_reload_conf()" >/dev/null
    cp "$log" "$dest"
    wait
    grep -E '^\| Postgres' "$out" || true
    rm -f "$out"
    python3 - "$dest" <<'EOF'
import collections, re, sys
shapes = collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"LOG:  (?:statement|execute [^:]*): (.*)", line)
    if m:
        sql = re.sub(r"\(\$\d+(, \$\d+)*\)(, \(\$\d+(, \$\d+)*\))*", "(..)", m.group(1))
        shapes[re.sub(r"\s+", " ", sql)[:90]] += 1
print(f"{sum(shapes.values())} statements")
for sql, n in shapes.most_common(25):
    print(f"{n:7d}  {sql}")
EOF
    ;;
  *)
    echo "usage: $0 cpu|sql BENCH_BIN CRATE_DIR ..." >&2
    exit 2
    ;;
esac
