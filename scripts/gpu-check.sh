#!/usr/bin/env bash
# GSaaS on a real GPU (issue [4/6]): the agent's NVML discovery and health watch, and a CUDA
# program that reaches the GPU only through a VM's masked endpoint, over LUPINE.
#
#   scripts/gpu-check.sh prepare [LUPINE_SRC]
#       Here, no GPU needed: builds gsaasd and rodvr-agent (release), fetches the Debian packages
#       the check needs (iproute2, nftables, conntrack, libnghttp2: unpacked there under /tmp,
#       never installed, used only where the machine lacks its own) and, with LUPINE's source
#       tree, copies it and builds its client here from CUDA headers out of PyPI wheels (what a
#       VM image needs; no GPU, no CUDA toolkit). Everything goes to .gpu-check/ (git ignores
#       it), which the GPU machine gets beside the repository.
#   scripts/gpu-check.sh run
#       There, as root, from the repository root with .gpu-check/ carried; nothing is fetched.
#       1. `rodvr-agent gpus`: NVML discovery and 5 s of health watch (model, memory, compute
#          capability, UUID, MIG mode, health).
#       1b. Two tenants' processes on GPU 0 under libgsaas-share.so (gpu-share/), each with
#          its own share (scripts/gpu-check/share_check.c, built there with cc): every
#          allocation path held to its share, the sharing calls refused, one's pointer
#          unreadable by the other, its memory freed within 1 s of its end (NVML), one's
#          kernel fault leaving the other's results right, two compute shares under MPS (where
#          nvidia-cuda-mps-control is), and the copy and kernel figures with and without it.
#       2. With LUPINE's source carried: builds its server there (nvcc) and the CUDA program
#          scripts/gpu-check/vecadd.cu; starts one LUPINE server on GPU 0 in a namespace that
#          plays the GPU host, launches a VM (a namespace) through gsaasd with
#          `remoting = "lupine"` and real agents, checks the VM cannot reach the server directly,
#          and runs the program in the VM through LUPINE's client at its masked endpoint; then
#          the same program directly on the GPU; then a second tenant's VM, and the program in
#          both VMs at once on the one GPU. Prints the results and bandwidths. Where the
#          kernel's namespaces lack veth, bridges or nftables (gVisor), the program runs through
#          LUPINE over loopback instead, and the output says the masked path was not tested.
#       GPU_CHECK_LOGS=DIR keeps the logs of gsaasd, the agents, the GPU server and the build.
#   scripts/gpu-check.sh selftest
#       Here, as root, no GPU: `run`'s whole path with the stand-in NVML
#       (rodvr-agent/tests/fake-nvml) and a stand-in for LUPINE's server, so the script is
#       proven before it spends GPU time; with LUPINE's client prepared, the real client
#       connects to the stand-in through the VM's masked endpoint.
#
# GPU time: `run` takes a few minutes, most of it building LUPINE's server. Every wait is
# bounded; namespaces and processes are removed on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
gc=$root/.gpu-check
bin=$gc/bin
say() { printf '\n== %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# prepare (here)

# CUDA's and NVML's headers from NVIDIA's PyPI wheels into $gc/cuda, as LUPINE's own CI does.
cuda_headers() {
  [ -f "$gc/cuda/include/cuda.h" ] && [ -f "$gc/cuda/include/nvml.h" ] && return
  rm -rf "$gc/cuda" "$gc/wheels" && mkdir -p "$gc/cuda/include" "$gc/wheels"
  python3 -m pip download -q --dest "$gc/wheels" --only-binary=:all: \
    --platform manylinux2014_x86_64 --implementation py --python-version 3 --abi none --no-deps \
    nvidia-cuda-runtime nvidia-nvml-dev
  for wheel in "$gc"/wheels/*.whl; do
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$wheel" "$gc/wheels/x"
  done
  for header in cuda.h nvml.h; do
    found=$(find "$gc/wheels/x" -path "*/include/$header" -print -quit)
    [ -n "$found" ] || die "no $header in the wheels"
    cp -R "$(dirname "$found")/." "$gc/cuda/include/"
  done
  rm -rf "$gc/wheels"
}

# LUPINE's client (libcuda.so.1, libnvidia-ml.so.1) into $gc/lupine-client, from $gc/lupine-src.
build_lupine_client() {
  cuda_headers
  local build=/tmp/gsaas-gpu-check-client-build
  cmake -S "$gc/lupine-src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLUPINE_BUILD_SERVER=OFF \
    -DLUPINE_BUILD_HIP=OFF -DBUILD_TESTING=OFF -DCMAKE_PREFIX_PATH="$gc/cuda" \
    -DCUDAToolkit_ROOT="$gc/cuda" >"$build.log" 2>&1 \
    || { tail -30 "$build.log"; die "configuring LUPINE's client failed"; }
  cmake --build "$build" --parallel "$(nproc)" --target lupine_cuda_client lupine_nvml_client \
    >>"$build.log" 2>&1 || { tail -30 "$build.log"; die "building LUPINE's client failed"; }
  mkdir -p "$gc/lupine-client"
  cp -L "$build/libcuda.so.1" "$build/libnvidia-ml.so.1" "$gc/lupine-client/"
  echo "LUPINE's client built without a GPU: $(ls "$gc/lupine-client" | tr '\n' ' ')"
}

prepare() {
  local src=${1:-}
  mkdir -p "$gc/bin" "$gc/debs"
  say "building gsaasd and rodvr-agent (release)"
  cargo build -q --release --locked -p gsaasd -p rodvr-agent
  for exe in gsaasd rodvr-agent; do
    cp "target/release/$exe" "$gc/bin/$exe" && strip "$gc/bin/$exe"
  done
  say "Debian packages to unpack there (tools the image may lack, and libnghttp2 for LUPINE)"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cmake g++ \
    libnghttp2-dev >/dev/null
  (cd "$gc/debs" && rm -f ./*.deb && apt-get download -q nftables libnftables1 libnftnl11 \
    libjansson4 libedit2 libxtables12 libbsd0 libmd0 conntrack libnetfilter-conntrack3 \
    libnfnetlink0 libmnl0 iproute2 libbpf1 libelf1 libcap2 libnghttp2-14 libnghttp2-dev >/dev/null)
  if [ -n "$src" ]; then
    [ -f "$src/CMakeLists.txt" ] && [ -f "$src/transport.cpp" ] || die "$src is no LUPINE source tree"
    say "LUPINE's source, from $src"
    rm -rf "$gc/lupine-src" && mkdir -p "$gc/lupine-src"
    # The tree without its git history and test submodules: what a build needs.
    (cd "$src" && tar --exclude=.git --exclude=test/cuda-samples -cf - .) | tar -xf - -C "$gc/lupine-src"
    build_lupine_client
  fi
  du -sh "$gc" | sed 's/^/to carry: /'
}

# ---------------------------------------------------------------------------------------------
# The tools: the machine's own, else the carried packages unpacked under /tmp.

tools() {
  # The carried packages are unpacked apart, and a tool the machine lacks runs from there through
  # a wrapper that gives it their libraries: they never shadow the machine's own for anything
  # else (the GPU image is newer than Debian 12).
  local unpacked=/tmp/gsaas-gpu-check-root
  rm -rf "$unpacked" && mkdir -p "$unpacked/wrap" "$unpacked/nghttp2"
  for deb in "$gc"/debs/*.deb; do
    [ -e "$deb" ] && dpkg-deb -x "$deb" "$unpacked"
  done
  local libs=$unpacked/usr/lib/x86_64-linux-gnu:$unpacked/lib/x86_64-linux-gnu found
  for tool in ip nft conntrack; do
    command -v "$tool" >/dev/null && continue
    found=$(find "$unpacked" -path "*bin/$tool" -type f -print -quit)
    [ -n "$found" ] || continue
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libs" "$found" >"$unpacked/wrap/$tool"
    chmod +x "$unpacked/wrap/$tool"
    echo "$tool: the carried one (Debian 12's)"
  done
  export PATH=$PATH:$unpacked/wrap
  # LUPINE builds against the carried libnghttp2 (the machine's where none is carried) and runs
  # with it, which a machine without one needs.
  nghttp2_root=/usr nghttp2_lib=$unpacked/nghttp2
  if [ -f "$unpacked/usr/include/nghttp2/nghttp2.h" ]; then
    nghttp2_root=$unpacked/usr
    cp -a "$unpacked"/usr/lib/x86_64-linux-gnu/libnghttp2.so* "$nghttp2_lib/"
  fi
  for tool in ip nft nsenter conntrack python3; do
    command -v "$tool" >/dev/null || { echo "missing: $tool"; return 1; }
  done
}

# Whether this kernel gives namespaces what the masked path needs: veth pairs, a bridge and
# nftables with NAT (gVisor, for one, has no nftables).
netns_works() {
  local probe=gsaas-gpu-check-probe$$ ok=0
  ip netns add "$probe" || return 1
  ip -n "$probe" link add p0 type veth peer name p1 || ok=1
  ip -n "$probe" link add b0 type bridge || ok=1
  echo 'table ip t { chain c { type nat hook prerouting priority dstnat; }; }' |
    nsenter --net="/run/netns/$probe" nft -f - || ok=1
  ip netns del "$probe"
  return $ok
}

# ---------------------------------------------------------------------------------------------
# The masked path: gsaasd, an agent on a host without GPUs (the VM's) and one on the GPU host,
# in namespaces this script makes; the GPU server is started in the GPU host's namespace, a VM is
# launched with `remoting = "lupine"`, and `$vm_program` runs inside it with its environment.

P=gc$$-
NS=()
PIDS=()
work=

cleanup() {
  # Each was started in a session of its own (spawn_in_ns): its group is it and what it forked.
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill -- "-$pid" 2>/dev/null || true; done
  local until=$((SECONDS + 5))
  while [ $SECONDS -lt $until ]; do
    local alive=
    for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    [ -n "$alive" ] || break
    sleep 0.1
  done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null || true; done
  # LUPINE's server forks a process per connection.
  pkill -f /tmp/gsaas-gpu-check-lupine/lupine_driver_server 2>/dev/null || true
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # GPU_CHECK_LOGS=DIR keeps the logs of gsaasd, the agents, the GPU server and LUPINE's build.
  if [ -n "${GPU_CHECK_LOGS:-}" ]; then
    cp "$work"/*.log /tmp/gsaas-gpu-check-lupine.log "$GPU_CHECK_LOGS/" 2>/dev/null || true
  fi
  [ -n "$work" ] && rm -rf "$work"
}

netns() { ip netns add "$P$1" && ip -n "$P$1" link set lo up && NS+=("$P$1"); }
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$P$ns" "$@"; }
# Starts `$@` in namespace $1 in the background, recorded in PIDS, in a session of its own, so
# that cleanup ends it and whatever it forked. Not `in_ns ... &`: that backgrounds a subshell
# running the function, whose PID is not the command's, and killing it orphaned the command.
# (setsid, not a group leader in a script's job, execs in place: $! is the command's PID.)
spawn_in_ns() { local ns=$1; shift; setsid nsenter --net="/run/netns/$P$ns" "$@" & PIDS+=($!); }
veth() { # ns-a if-a cidr-a ns-b if-b cidr-b
  ip -n "$P$1" link add "$2" type veth peer name "$5" netns "$P$4"
  [ -n "$3" ] && ip -n "$P$1" addr add "$3" dev "$2"
  [ -n "$6" ] && ip -n "$P$4" addr add "$6" dev "$5"
  ip -n "$P$1" link set "$2" up && ip -n "$P$4" link set "$5" up
}
http() { # TOKEN METHOD PATH [BODY]: gsaasd's answer, from the controller's namespace
  in_ns ctl python3 "$work_http" "$1" "$2" "http://10.240.0.1:8700$3" "${4:-}"
}
wait_until() { # SECONDS WHAT COMMAND...
  local until=$((SECONDS + $1)) what=$2; shift 2
  until "$@"; do
    [ $SECONDS -lt $until ] || { echo "timed out waiting for $what"; return 1; }
    sleep 0.2
  done
}
json() { python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

# Two tenants' processes on GPU 0 at once, each under its own share state as the agent writes
# one, with libgsaas-share.so preloaded (issue [1/5]): every allocation path held to its share
# and refused past it; the sharing calls refused; one tenant's pointer unreadable by the other;
# its memory freed on the GPU within 1 s of its end (NVML); a fault in one tenant's kernel
# leaving the other's results right; two compute shares under MPS; what the interposer costs.
# LIBCUDA_DIR (the self-test: gpu-share's stand-in driver) goes on the library path; whatever
# that driver cannot do (kernels, copies) says "skipped". Fails if a share or an isolation did
# not hold.
share_checks() {
  local sc=/tmp/gsaas-share-check lib=$root/gpu-share/build/libgsaas-share.so
  local dir a b bad=()
  make -s -C "$root/gpu-share" >/dev/null || die "building gpu-share failed"
  cc -O2 -std=c11 -I"$root/gpu-share/include" -o "$sc" scripts/gpu-check/share_check.c -ldl \
    || die "building share_check failed"
  dir=$(mktemp -d /tmp/gsaas-share-check.XXXXXX)
  a=$dir/a.share b=$dir/b.share
  "$sc" mkshare "$a" 2048 256 && "$sc" mkshare "$b" 6144 512
  tenant() { # SHARE ARGS...: share_check as that tenant's server process
    local share=$1; shift
    env ${LIBCUDA_DIR:+LD_LIBRARY_PATH=$LIBCUDA_DIR} LD_PRELOAD="$lib" GSAAS_SHARE_FILE="$share" \
      timeout 120 "$sc" "$@"
  }
  verdict() { # RC WHAT: 0 held, 77 skipped, else failed
    case $1 in
      0) ;;
      77) echo "  ($2: skipped on this driver)" ;;
      *) bad+=("$2") ;;
    esac
  }
  echo "tenant A (a 2 GiB share, 256 MiB pinned) and tenant B (6 GiB, 512 MiB), at once:"
  local ra=0 rb=0 pa pb
  tenant "$a" fill 2048 256 >"$dir/a.out" 2>&1 & pa=$!
  tenant "$b" fill 6144 512 >"$dir/b.out" 2>&1 & pb=$!
  wait $pa || ra=$?
  wait $pb || rb=$?
  sed 's/^/A /' "$dir/a.out"
  sed 's/^/B /' "$dir/b.out"
  verdict $ra "tenant A's share"
  verdict $rb "tenant B's share"
  echo "the calls that share memory between processes:"
  local r=0
  tenant "$a" ipc || r=$?
  verdict $r "the sharing calls"
  echo "tenant B reads tenant A's device pointer:"
  # Tenant A holds its memory while its stdin (a FIFO) stays open.
  local line="" ptr="" apid="" hold
  mkfifo "$dir/hold.in"
  tenant "$a" hold 256 <"$dir/hold.in" >"$dir/hold.out" 2>&1 & hold=$!
  exec 7>"$dir/hold.in"
  for _ in $(seq 600); do
    line=$(head -n 1 "$dir/hold.out")
    [ -n "$line" ] && break
    kill -0 "$hold" 2>/dev/null || break
    sleep 0.1
  done
  line=$(head -n 1 "$dir/hold.out")
  case $line in
    "pointer "*)
      ptr=$(echo "$line" | awk '{print $2}') apid=$(echo "$line" | awk '{print $4}')
      r=0
      tenant "$b" peek "$ptr" || r=$?
      verdict $r "another tenant's pointer"
      ;;
    *) echo "  ${line:-tenant A held nothing}"; verdict 77 "another tenant's pointer" ;;
  esac
  # Tenant A ends (its server would, at a detach): the GPU has its memory back within 1 s.
  local started=$SECONDS
  exec 7>&-
  wait "$hold" 2>/dev/null || true
  if [ -n "$apid" ] && command -v nvidia-smi >/dev/null; then
    local t0 t1
    t0=$(date +%s%N)
    while nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$apid"; do
      [ $((SECONDS - started)) -lt 10 ] || break
      sleep 0.05
    done
    t1=$(date +%s%N)
    local ms=$(((t1 - t0) / 1000000))
    echo "tenant A ended: NVML lists its process no more after $ms ms"
    [ "$ms" -le 1000 ] || bad+=("memory freed within 1 s")
  else
    echo "  (memory freed at the end: skipped, no GPU process or no nvidia-smi)"
  fi
  echo "tenant A's kernel faults while tenant B works:"
  local rw=0 rf=0 pw
  tenant "$b" work 50 >"$dir/work.out" 2>&1 & pw=$!
  tenant "$a" fault || rf=$?
  wait $pw || rw=$?
  sed 's/^/B /' "$dir/work.out"
  [ $rf = 1 ] && bad+=("tenant A's fault was not reported")
  verdict $rw "tenant B's results beside tenant A's fault"
  if command -v nvidia-cuda-mps-control >/dev/null && [ -z "${LIBCUDA_DIR:-}" ]; then
    echo "compute shares under MPS: tenant A 25% of the SMs, tenant B 75%, both busy at once:"
    export CUDA_MPS_PIPE_DIRECTORY=$dir/mps-pipe CUDA_MPS_LOG_DIRECTORY=$dir/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 tenant "$a" spin 5 >"$dir/spin-a.out" 2>&1 & pa=$!
      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75 tenant "$b" spin 5 >"$dir/spin-b.out" 2>&1 & pb=$!
      wait $pa || true
      wait $pb || true
      sed 's/^/A (25%) /' "$dir/spin-a.out"
      sed 's/^/B (75%) /' "$dir/spin-b.out"
      echo quit | nvidia-cuda-mps-control || true
    else
      echo "  (MPS did not start: compute shares not measured)"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  else
    echo "(compute shares: skipped, no MPS here)"
  fi
  echo "what the interposer costs (the same process without it, with it, twice):"
  for round in 1 2; do
    r=0
    env ${LIBCUDA_DIR:+LD_LIBRARY_PATH=$LIBCUDA_DIR} timeout 120 "$sc" bench | sed 's/^/without /' || r=$?
    tenant "$a" bench | sed 's/^/with    /' || true
  done
  rm -rf "$dir"
  if [ ${#bad[@]} -gt 0 ]; then
    echo "FAILED: ${bad[*]}"
    return 1
  fi
  echo "every share and isolation held"
}

# $1: the GPU host agent's extra config ([gpu_servers]; its GPUs from NVML);
# gpu_agent_env: the GPU host agent's environment (the stand-in NVML in the self-test);
# $no_gpus: a stand-in NVML that finds no GPU, for the VM host's agent (on a GPU machine the
# real driver would show it the GPU, and it has no GPU servers).
# The GPU server is started apart (start_gpu_server), so a broken setup shows before a build.
gpu_agent_env=()
masked_path() {
  local gpu_host_extra=$1
  work=$(mktemp -d /tmp/gsaas-gpu-check.XXXXXX)
  chmod 700 "$work"
  netns mgmt && netns ctl && netns crg && netns cg
  for bridge in br0 gbr0; do
    ip -n "${P}mgmt" link add "$bridge" type bridge && ip -n "${P}mgmt" link set "$bridge" up
  done
  veth ctl mgmt0 10.240.0.1/24 mgmt p-ctl "" && ip -n "${P}mgmt" link set p-ctl master br0
  veth crg mgmt0 10.240.0.11/24 mgmt p-crg "" && ip -n "${P}mgmt" link set p-crg master br0
  veth cg mgmt0 10.240.0.12/24 mgmt p-cg "" && ip -n "${P}mgmt" link set p-cg master br0
  veth crg gpu0 10.232.0.1/24 mgmt g-crg "" && ip -n "${P}mgmt" link set g-crg master gbr0
  veth cg gpu0 10.232.0.2/24 mgmt g-cg "" && ip -n "${P}mgmt" link set g-cg master gbr0
  in_ns crg sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
  # The GPU host routes back to VMs, so only the agent's filter keeps them out.
  ip -n "${P}cg" route add 10.77.0.0/24 via 10.232.0.1
  ip -n "${P}crg" addr add 10.78.0.1/32 dev lo
  if ! in_ns crg nft list tables >/dev/null 2>&1; then
    echo "nftables does not work in a namespace here ($(uname -r)): no masked path"
    return 2
  fi

  cat >"$work/gsaasd.toml" <<EOF
listen = "10.240.0.1:8700"
data_dir = "$work/gsaasd"
default_policy = "first-fit"

[launch]
active_timeout_secs = 30
deploy_timeout_secs = 30
agent_timeout_ms = 5000

[cloud]
backend = "sim"

[cloud.sim]
fixed_ip_range = "10.77.0.0/24"

[cloud.sim.vm_network]
kind = "netns"
namespaces = { "vm-host" = "${P}crg", "gpu-host" = "${P}cg" }
vm_namespace_prefix = "${P}vm-"

[hosts]
backend = "agent"
agent_urls = { "vm-host" = "http://10.240.0.11:7450", "gpu-host" = "http://10.240.0.12:7450" }
EOF
  local gsaasd=$bin/gsaasd agent=$bin/rodvr-agent
  "$gsaasd" public-key -c "$work/gsaasd.toml" >"$work/controller.pub.pem"
  member=$("$gsaasd" token issue --role member --project gpu-check -c "$work/gsaasd.toml")
  member2=$("$gsaasd" token issue --role member --project gpu-check-2 -c "$work/gsaasd.toml")
  admin=$("$gsaasd" token issue --role admin --project ops -c "$work/gsaasd.toml")
  agent_config() { # host address extra
    local token
    token=$("$gsaasd" token issue --role agent --host "$1" -c "$work/gsaasd.toml")
    cat >"$work/$1.toml" <<EOF
host = "$1"
listen = "$2:7450"
state_file = "$work/$1.routes.json"
controller_public_key = "$work/controller.pub.pem"
masked_range = "100.127.0.0/16"
gpu_interface = "gpu0"
retry_interval_secs = 1
$3
[controller]
url = "http://10.240.0.1:8700"
token = "$token"
heartbeat_interval_secs = 1
EOF
  }
  agent_config vm-host 10.240.0.11 'metadata_listen = "10.78.0.1:8775"'
  agent_config gpu-host 10.240.0.12 "$gpu_host_extra"

  spawn_in_ns ctl env RUST_LOG=warn "$gsaasd" serve -c "$work/gsaasd.toml" >"$work/gsaasd.log" 2>&1
  spawn_in_ns crg env LD_LIBRARY_PATH="$no_gpus" FAKE_NVML_GPUS= "$agent" \
    --config "$work/vm-host.toml" >"$work/vm-host.log" 2>&1
  spawn_in_ns cg env "${gpu_agent_env[@]}" "$agent" --config "$work/gpu-host.toml" \
    >"$work/gpu-host.log" 2>&1

  hosts_ready() {
    http "$admin" GET /v1/hosts 2>/dev/null |
      json "sum(1 for h in v['hosts'] if h['state'] == 'schedulable')" 2>/dev/null | grep -qx 2
  }
  wait_until 30 "both hosts to register" hosts_ready \
    || { tail -5 "$work"/*.log; return 1; }
  http "$admin" GET /v1/pool |
    json "[(g['id'], g['model'], g['rcuda_endpoint'], g['remoting']) for h in v['hosts'] for g in h['gpus']]" |
    sed 's/^/GPUs in the pool: /'

  launch_vm "$member" || return 1
}

# Launches a VM of one shared cGPU (LUPINE, on another host than its GPU) with TOKEN's project
# and waits for it: sets vm_id, vm_ns (its namespace) and lupine_server (its masked endpoint).
launch_vm() {
  local launch='{"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1, "mode": "shared",
    "gpu_memory_mib": 16384, "locality": "remote", "remoting": "lupine"}' answer view
  answer=$(http "$1" POST /v1/vms "$launch")
  vm_id=$(json "v['id']" <<<"$answer" 2>/dev/null) || { echo "launch refused: $answer"; return 1; }
  vm_ready() { [ "$(http "$1" GET "/v1/vms/$vm_id" | json "v['state']")" = ready ]; }
  wait_until 40 "the VM to be ready" vm_ready "$1" || { http "$1" GET "/v1/vms/$vm_id"; return 1; }
  view=$(http "$1" GET "/v1/vms/$vm_id")
  vm_ns=${P}vm-$(json "v['server_id']" <<<"$view")
  lupine_server=$(json "v['gpu_env']['LUPINE_SERVER']" <<<"$view")
  [ -e "/run/netns/$vm_ns" ] && [ -n "$lupine_server" ] \
    || { echo "the VM has no namespace or no server: $view"; return 1; }
  echo "VM $vm_id ($(json "v.get('project')" <<<"$view")) in namespace $vm_ns:" \
    "LUPINE_SERVER=$lupine_server, GSAAS_CGPUS=$(json "v['gpu_env']['GSAAS_CGPUS']" <<<"$view")"
}

# The VM reaches the GPU server (listening now: the GPU host's namespace reaches it) only
# through its masked endpoint.
check_isolated() {
  if nsenter --net="/run/netns/$vm_ns" timeout 3 bash -c 'exec 3<>/dev/tcp/10.232.0.2/14833' 2>/dev/null; then
    die "the VM reached the GPU server directly"
  fi
  echo "the VM cannot reach the GPU server directly (10.232.0.2:14833), which listens: as it should"
}

# Starts `$@` in the GPU host's namespace (its log: gpu-server.log) and waits for its port.
start_gpu_server() {
  # shellcheck disable=SC2068
  spawn_in_ns cg $@ >"$work/gpu-server.log" 2>&1
  listening() { in_ns cg bash -c 'exec 3<>/dev/tcp/10.232.0.2/14833' 2>/dev/null; }
  wait_until 30 "the GPU server to listen" listening || { cat "$work/gpu-server.log"; return 1; }
}

# The stand-in NVML (rodvr-agent/tests/fake-nvml) in $no_gpus, built with the C compiler.
fake_nvml() {
  no_gpus=/tmp/gsaas-gpu-check-fake-nvml
  mkdir -p "$no_gpus"
  cc -shared -fPIC -O1 -o "$no_gpus/libnvidia-ml.so.1" rodvr-agent/tests/fake-nvml/fake_nvml.c
}

# ---------------------------------------------------------------------------------------------
# run (there) and selftest (here)

run() {
  [ "$(id -u)" = 0 ] || die "run as root (network namespaces)"
  [ -x "$gc/bin/rodvr-agent" ] || die "no .gpu-check/bin: run 'scripts/gpu-check.sh prepare' where cargo works, and carry .gpu-check"
  export PATH=$PATH:/usr/local/cuda/bin
  trap cleanup EXIT
  say "0. the machine"
  echo "kernel $(uname -r); $(nproc) CPUs"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  say "1. NVML discovery and health watch (rodvr-agent gpus, 5 s)"
  "$bin/rodvr-agent" gpus --watch-secs 5 || echo "FAILED: rodvr-agent gpus"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv
  fi
  say "1b. shares held on the GPU itself: two tenants under libgsaas-share.so"
  share_checks || echo "FAILED: shares on the GPU"
  if [ ! -d "$gc/lupine-src" ]; then
    say "2. skipped: no LUPINE source was prepared (scripts/gpu-check.sh prepare LUPINE_SRC)"
    return 0
  fi
  local missing=()
  for tool in cmake nvcc c++ cc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] || die "missing here: ${missing[*]} (LUPINE's server and the program are built here)"
  tools || die "the masked path needs ip, nft, nsenter, conntrack and python3"
  fake_nvml

  # Without the masked path (a kernel whose namespaces lack veth, bridges or nftables), LUPINE
  # still runs on the GPU, from client to server over loopback, and the result says so.
  say "2. the masked path: gsaasd, two agents, a VM launched with remoting = lupine"
  local masked=yes
  if ! netns_works; then
    masked=no
    echo "NOT TESTED HERE: this kernel ($(uname -r)) gives namespaces no veth, bridge or nftables"
  elif ! masked_path $'[gpu_servers]\naddress = "10.232.0.2"\nremoting = "lupine"'; then
    masked=no
    echo "NOT TESTED HERE: the masked path could not be set up (see above)"
  fi

  say "3. LUPINE (server and client) and the CUDA program, built here"
  local build=/tmp/gsaas-gpu-check-lupine started=$SECONDS generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$gc/lupine-src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DLUPINE_BUILD_HIP=OFF -DBUILD_TESTING=OFF -DNGHTTP2_INCLUDE_DIR="$nghttp2_root/include" \
    -DNGHTTP2_LIBRARY="$(ls "$nghttp2_root"/lib/x86_64-linux-gnu/libnghttp2.so* | head -1)" \
    >"$build.log" 2>&1 || { tail -40 "$build.log"; die "configuring LUPINE failed"; }
  cmake --build "$build" --parallel "$(nproc)" \
    --target lupine_driver_server lupine_cuda_client lupine_nvml_client >>"$build.log" 2>&1 \
    || { tail -40 "$build.log"; die "building LUPINE failed"; }
  # For the GPU it runs on (what a client forwards is then machine code, not PTX to compile).
  nvcc -O2 -arch=native -o /tmp/gsaas-vecadd scripts/gpu-check/vecadd.cu \
    || nvcc -O2 -o /tmp/gsaas-vecadd scripts/gpu-check/vecadd.cu || die "building vecadd failed"
  echo "built in $((SECONDS - started)) s"

  say "4. the program directly on the GPU"
  timeout 120 /tmp/gsaas-vecadd || echo "FAILED directly"

  # The client's libcuda.so.1 is in $build; the server loads the driver's own.
  local client_env=(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$build:$nghttp2_lib"
    LUPINE_DISABLE_LOCAL=1)
  local server_libs=$nghttp2_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if [ $masked = yes ]; then
    say "5. the program in the VM, through LUPINE's client at its masked endpoint"
    start_gpu_server env LD_LIBRARY_PATH="$server_libs" CUDA_VISIBLE_DEVICES=0 LUPINE_PORT=14833 \
      "$build/lupine_driver_server" || die "LUPINE's server did not start"
    check_isolated
    nsenter --net="/run/netns/$vm_ns" "${client_env[@]}" LUPINE_SERVER="$lupine_server" \
      timeout 180 /tmp/gsaas-vecadd \
      || { echo "FAILED through the masked endpoint"; tail -20 "$work/gpu-server.log"; return 1; }
    echo "gpu-check: the program ran on the GPU through the VM's masked endpoint"

    say "6. two tenants' VMs share the GPU: the program in both at once"
    local vms=("$vm_ns $lupine_server")
    launch_vm "$member2" || die "the second tenant's VM did not start"
    vms+=("$vm_ns $lupine_server")
    local pids=() i ns server failed=0
    for i in 0 1; do
      read -r ns server <<<"${vms[$i]}"
      nsenter --net="/run/netns/$ns" "${client_env[@]}" LUPINE_SERVER="$server" \
        timeout 180 /tmp/gsaas-vecadd >"$work/vm$i.out" 2>&1 &
      pids+=($!)
    done
    for i in 0 1; do
      wait "${pids[$i]}" || failed=1
      sed "s/^/tenant $((i + 1)): /" "$work/vm$i.out"
    done
    [ $failed = 0 ] || { tail -20 "$work/gpu-server.log"; return 1; }
    echo "gpu-check: two tenants' VMs ran the program on one GPU at once, each through its own" \
      "masked endpoint"
  else
    say "5. the program through LUPINE over loopback (no VM, no masking: see step 2)"
    [ -n "$work" ] || { work=$(mktemp -d /tmp/gsaas-gpu-check.XXXXXX); chmod 700 "$work"; }
    setsid env LD_LIBRARY_PATH="$server_libs" CUDA_VISIBLE_DEVICES=0 LUPINE_PORT=14833 \
      "$build/lupine_driver_server" >"$work/gpu-server.log" 2>&1 &
    PIDS+=($!)
    wait_until 30 "LUPINE's server to listen" bash -c 'exec 3<>/dev/tcp/127.0.0.1/14833' \
      2>/dev/null || { cat "$work/gpu-server.log"; die "LUPINE's server did not start"; }
    "${client_env[@]}" LUPINE_SERVER=127.0.0.1:14833 timeout 180 /tmp/gsaas-vecadd \
      || { echo "FAILED through LUPINE"; tail -20 "$work/gpu-server.log"; return 1; }
    echo "gpu-check: the program ran on the GPU through LUPINE; the masked path was NOT tested"
  fi
}

selftest() {
  [ "$(id -u)" = 0 ] || die "run as root (network namespaces)"
  # This checkout's own binaries (a quick build), not the release ones carried to a GPU.
  cargo build -q --locked -p gsaasd -p rodvr-agent
  bin=$root/target/debug
  tools || die "tools are missing here"
  trap cleanup EXIT
  fake_nvml
  local gpu="NVIDIA H100 80GB HBM3:81559:9.0:GPU-5e1f7e57:0:0:0:0:0"
  say "1. NVML discovery and health watch, against the stand-in NVML"
  LD_LIBRARY_PATH=$no_gpus FAKE_NVML_GPUS=$gpu "$bin/rodvr-agent" gpus --watch-secs 1
  say "1b. shares, against gpu-share's stand-in driver (what needs kernels is skipped)"
  export LIBCUDA_DIR=$root/gpu-share/build/standin GSAAS_STANDIN_MEMORY_MIB=16384
  share_checks || die "the share checks failed"
  unset LIBCUDA_DIR GSAAS_STANDIN_MEMORY_MIB
  say "2. the masked path, with a stand-in for LUPINE's server"
  gpu_agent_env=(LD_LIBRARY_PATH="$no_gpus" FAKE_NVML_GPUS="$gpu")
  masked_path $'[gpu_servers]\naddress = "10.232.0.2"\nremoting = "lupine"'
  start_gpu_server python3 "$work_standin" 10.232.0.2 14833
  check_isolated
  # The stand-in greets each connection with what it saw: the bytes a client sent first, and
  # from where. Through the masked endpoint it sees the VM's host's address on the GPU network.
  local host=${lupine_server%:*} port=${lupine_server#*:}
  local greeting
  greeting=$(nsenter --net="/run/netns/$vm_ns" timeout 5 bash -c \
    "exec 3<>/dev/tcp/$host/$port; printf 'hello' >&3; head -c 200 <&3")
  echo "through the masked endpoint: $greeting"
  case $greeting in
    "stand-in 10.232.0.1 hello"*) ;;
    *) die "the masked endpoint did not reach the stand-in as it should" ;;
  esac
  local first_ns=$vm_ns first_server=$lupine_server
  launch_vm "$member2" || die "the second tenant's VM did not start"
  host=${lupine_server%:*} port=${lupine_server#*:}
  greeting=$(nsenter --net="/run/netns/$vm_ns" timeout 5 bash -c \
    "exec 3<>/dev/tcp/$host/$port; printf 'second' >&3; head -c 200 <&3")
  echo "the second tenant's VM, through its masked endpoint: $greeting"
  case $greeting in
    "stand-in 10.232.0.1 second"*) ;;
    *) die "the second tenant's masked endpoint did not reach the stand-in" ;;
  esac
  vm_ns=$first_ns lupine_server=$first_server
  if [ -f "$gc/lupine-client/libcuda.so.1" ]; then
    say "3. LUPINE's real client, in the VM, at its masked endpoint"
    cc -o /tmp/gsaas-cuinit -I"$gc/cuda/include" scripts/gpu-check/cuinit.c -ldl
    nsenter --net="/run/netns/$vm_ns" env -i PATH=/usr/bin:/bin \
      LD_LIBRARY_PATH="$gc/lupine-client:$nghttp2_lib" \
      LUPINE_SERVER="$lupine_server" LUPINE_DISABLE_LOCAL=1 timeout 60 /tmp/gsaas-cuinit || true
    sleep 0.5
    if grep -aq "^from 10.232.0.1: b'PRI \* HTTP/2.0" "$work/gpu-server.log"; then
      echo "the stand-in got LUPINE's HTTP/2 connection preface from the VM's host (10.232.0.1):" \
        "the real client reached it through the masked endpoint"
    else
      cat "$work/gpu-server.log"
      die "LUPINE's client did not reach the stand-in through the masked endpoint"
    fi
  else
    say "3. skipped: LUPINE's client was not prepared (scripts/gpu-check.sh prepare LUPINE_SRC)"
  fi
  echo "selftest: OK"
}

# A stand-in for LUPINE's server: logs what each client sends first and from where, and greets
# it with the same ("stand-in <peer> <first bytes>").
work_standin=/tmp/gsaas-gpu-check-standin.py
cat >"$work_standin" <<'PY'
import socket, sys, threading
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((sys.argv[1], int(sys.argv[2])))
listener.listen(16)
def serve(conn, peer):
    conn.settimeout(5)
    try:
        first = conn.recv(64)
    except OSError:
        first = b""
    print(f"from {peer[0]}: {first[:24]!r}", flush=True)
    try:
        conn.sendall(f"stand-in {peer[0]} {first.decode('latin-1')}".encode("latin-1"))
    except OSError:
        pass
    conn.close()
while True:
    conn, peer = listener.accept()
    threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
PY

# gsaasd's answer to TOKEN METHOD URL [BODY] on standard output, whatever its status; fails
# only when gsaasd cannot be reached.
work_http=/tmp/gsaas-gpu-check-http.py
cat >"$work_http" <<'PY'
import sys, urllib.error, urllib.request
token, method, url, body = sys.argv[1:5]
request = urllib.request.Request(url, method=method, data=body.encode() if body else None,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        sys.stdout.write(answer.read().decode())
except urllib.error.HTTPError as refusal:
    sys.stdout.write(refusal.read().decode())
PY

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  run) run ;;
  selftest) selftest ;;
  *) sed -n '2,30p' "$0" >&2; exit 2 ;;
esac
