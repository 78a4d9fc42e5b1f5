#!/usr/bin/env python3
"""Runs gsaasd and one node's rodvr-agent exactly as the Helm chart renders them, without Kubernetes.

For each pod it takes the rendered container's command, args, env and volume mounts, and the pod's
security context, and reproduces what the kubelet would give the container:
- ConfigMap and Secret volumes as files (the items, paths and modes the manifest asks for),
  mounted read-only, owned by root and the pod's fsGroup as the kubelet sets them; emptyDir,
  hostPath and PersistentVolumeClaim volumes as writable directories;
- a root filesystem of the host's /usr (the image's binaries in /usr/local/bin), read-only where
  the container asks for readOnlyRootFilesystem;
- the container's user, primary group 0 and supplementary fsGroup; env from values, Secrets,
  ConfigMaps and the downward API (the node's name and address).
Both run in one network namespace, where the Service and the node resolve to 127.0.0.1.

It checks, statically, that no agent can read gsaasd's signing key or another node's token, and
then that both become ready: gsaasd answers /readyz, the agent's port is open, the agent registers
its node with its token, and gsaasd's reconciler reaches the agent (at the URL gsaasd's config
pins, with a token for that host) without error, and the agent's metadata listener answers where
the rendered config puts it.

Usage, as root: helm-run.py RENDERED.yaml BIN_DIR SIGNING_KEY.pem NODE
(a child mode, `--child SPEC.json`, is what runs inside each container's mount namespace)
"""

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

WAIT = 60


def fail(message):
    sys.exit("helm-run: " + message)


# ---- inside a container's mount namespace ----

def mount(*args):
    subprocess.run(["mount", *args], check=True)


def child(spec_path):
    spec = json.load(open(spec_path))
    root = spec["root"]
    mount("--bind", root, root)
    for name in ("bin", "sbin", "lib", "lib64"):
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, name))
        elif os.path.isdir(host):
            os.makedirs(os.path.join(root, name))
            mount("--bind", "-o", "ro", host, os.path.join(root, name))
    for name in ("usr", "proc", "dev", "tmp", "etc/ssl"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    mount("--rbind", "/usr", os.path.join(root, "usr"))
    mount("-o", "remount,bind,ro", os.path.join(root, "usr"))
    mount("--bind", "-o", "ro", spec["bin_dir"], os.path.join(root, "usr/local/bin"))
    mount("-t", "proc", "proc", os.path.join(root, "proc"))
    mount("--rbind", "/dev", os.path.join(root, "dev"))
    mount("--bind", "-o", "ro", "/etc/ssl", os.path.join(root, "etc/ssl"))
    for source, target, read_only, is_file in spec["mounts"]:
        path = os.path.join(root, target.lstrip("/"))
        if is_file:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        else:
            os.makedirs(path, exist_ok=True)
        mount("--bind", source, path)
        if read_only:
            mount("-o", "remount,bind,ro", path)
    if spec["read_only_root"]:
        mount("-o", "remount,bind,ro", root)
    os.chroot(root)
    os.chdir("/")
    if spec["uid"] is not None:
        os.setgroups([spec["fs_group"]] if spec["fs_group"] is not None else [])
        os.setgid(0)
        os.setuid(spec["uid"])
    env = dict(spec["env"], PATH="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", HOME="/")
    os.execvpe(spec["argv"][0], spec["argv"], env)


# ---- the manifests ----

def load(rendered):
    import yaml

    return [d for d in yaml.safe_load_all(open(rendered)) if d]


def secret_data(secret):
    data = dict(secret.get("stringData") or {})
    for key, value in (secret.get("data") or {}).items():
        data[key] = base64.b64decode(value).decode()
    return data


def agent_node(daemonset):
    affinity = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return terms[0]["matchFields"][0]["values"][0]


def check_least_privilege(docs):
    """No agent reads gsaasd's Secret or another node's token; agents' ConfigMaps hold no key."""
    secrets = {d["metadata"]["name"]: secret_data(d) for d in docs if d["kind"] == "Secret"}
    signing = [n for n, data in secrets.items() if "signing-key.pem" in data]
    if len(signing) != 1:
        fail("expected one Secret with the signing key, found %s" % signing)
    for d in docs:
        if d["kind"] == "ConfigMap" and "PRIVATE KEY" in json.dumps(d):
            fail("ConfigMap %s holds a private key" % d["metadata"]["name"])
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    if not daemonsets:
        fail("no agent DaemonSet was rendered")
    for d in daemonsets:
        name, pod = d["metadata"]["name"], d["spec"]["template"]["spec"]
        used = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        for c in pod["containers"]:
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    used.add(ref["name"])
        if used != {name}:
            fail("agent %s reads the Secrets %s, not only its own token" % (name, sorted(used)))
        if set(secrets[name]) != {"token"}:
            fail("agent %s's Secret holds %s, not only its token" % (name, sorted(secrets[name])))


# ---- running a pod's container ----

def materialize(docs, pod, container, workdir, node):
    """The container's mounts as (source, target, read_only, is_file), its env, and its argv."""
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: secret_data(d) for d in docs if d["kind"] == "Secret"}
    fs_group = (pod.get("securityContext") or {}).get("fsGroup")
    volumes = {}
    for volume in pod["volumes"]:
        path = os.path.join(workdir, "volumes", volume["name"])
        os.makedirs(path)
        if "configMap" in volume or "secret" in volume:
            spec = volume.get("configMap") or volume["secret"]
            data = configmaps[spec["name"]] if "configMap" in volume else secrets[spec["secretName"]]
            default_mode = spec.get("defaultMode", 0o644)
            items = spec.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                file = os.path.join(path, item["path"])
                with open(file, "w") as f:
                    f.write(data[item["key"]])
                mode = item.get("mode", default_mode)
                if fs_group is not None:
                    os.chown(file, 0, fs_group)
                    mode |= 0o440
                os.chmod(file, mode)
            if fs_group is not None:
                os.chown(path, 0, fs_group)
                os.chmod(path, 0o2755)
            volumes[volume["name"]] = (path, True)
        else:
            # emptyDir (0777, as the kubelet makes it), a claim or a host path (writable).
            if "emptyDir" in volume:
                os.chmod(path, 0o777)
            elif fs_group is not None:
                os.chown(path, 0, fs_group)
                os.chmod(path, 0o2775)
            volumes[volume["name"]] = (path, False)
    mounts = []
    for m in container.get("volumeMounts", []):
        source, always_ro = volumes[m["name"]]
        if "subPath" in m:
            source = os.path.join(source, m["subPath"])
        mounts.append((source, m["mountPath"], always_ro or m.get("readOnly", False), "subPath" in m))
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        ref = e["valueFrom"]
        if "secretKeyRef" in ref:
            env[e["name"]] = secrets[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
        elif "configMapKeyRef" in ref:
            env[e["name"]] = configmaps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
        else:
            field = ref["fieldRef"]["fieldPath"]
            env[e["name"]] = {"spec.nodeName": node, "status.hostIP": "127.0.0.1"}[field]
    argv = (container.get("command") or []) + (container.get("args") or [])
    return mounts, env, argv, fs_group


def start(name, docs, pod, container, workdir, bin_dir, netns, node):
    work = os.path.join(workdir, name)
    os.makedirs(work)
    mounts, env, argv, fs_group = materialize(docs, pod, container, work, node)
    pod_sc = pod.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if pod_sc.get("runAsNonRoot") and not uid:
        fail("%s asks for a non-root user but names none" % name)
    root = os.path.join(work, "root")
    os.makedirs(os.path.join(root, "etc"))
    for file in ("passwd", "group", "nsswitch.conf", "ld.so.cache"):
        if os.path.exists("/etc/" + file):
            shutil.copy("/etc/" + file, os.path.join(root, "etc", file))
    spec = {
        "root": root, "bin_dir": bin_dir, "mounts": mounts, "env": env, "argv": argv,
        "uid": uid, "fs_group": fs_group, "read_only_root": sc.get("readOnlyRootFilesystem", False),
    }
    with open(os.path.join(root, "etc", "hosts"), "w") as f:
        f.write("127.0.0.1 localhost %s %s\n" % (" ".join(netns["names"]), node))
    spec_path = os.path.join(work, "spec.json")
    json.dump(spec, open(spec_path, "w"))
    log = open(os.path.join(work, "log"), "w")
    command = ["ip", "netns", "exec", netns["name"], "unshare", "--mount", "--propagation", "private",
               sys.executable, os.path.abspath(__file__), "--child", spec_path]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, os.path.join(work, "log")


def in_netns(netns, code):
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code],
                         capture_output=True, text=True)
    return out.stdout.strip()


def until(what, check, logs):
    deadline = time.time() + WAIT
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    for log in logs:
        sys.stderr.write("----- %s -----\n%s\n" % (log, open(log).read()))
    fail("timed out after %d s waiting for %s" % (WAIT, what))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    if len(sys.argv) != 5:
        fail("usage: helm-run.py RENDERED.yaml BIN_DIR SIGNING_KEY NODE")
    rendered, bin_dir, signing_key, node = sys.argv[1:]
    docs = load(rendered)
    check_least_privilege(docs)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet" and agent_node(d) == node)
    service = next(d for d in docs if d["kind"] == "Service")["metadata"]["name"]
    port = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    agent_port = daemonset["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]

    workdir = tempfile.mkdtemp(prefix="gsaas-helm-run-")
    os.chmod(workdir, 0o755)
    netns = {"name": "gsaas-helm-%d" % os.getpid(), "names": [service]}
    subprocess.run(["ip", "netns", "add", netns["name"]], check=True)
    subprocess.run(["ip", "-n", netns["name"], "link", "set", "lo", "up"], check=True)
    processes = []
    try:
        for name, workload in (("gsaasd", deployment), ("agent", daemonset)):
            pod = workload["spec"]["template"]["spec"]
            processes.append(start(name, docs, pod, pod["containers"][0], workdir, bin_dir,
                                   netns, node))
        logs = [log for _, log in processes]

        def get(path, token=None):
            code = (
                "import urllib.request, sys\n"
                "r = urllib.request.Request('http://127.0.0.1:%d%s')\n" % (port, path)
                + ("r.add_header('Authorization', 'Bearer %s')\n" % token if token else "")
                + "try:\n  print(urllib.request.urlopen(r, timeout=2).read().decode())\n"
                "except Exception:\n  pass\n"
            )
            text = in_netns(netns["name"], code)
            return json.loads(text) if text else None

        def agent_open():
            code = ("import socket\ntry:\n  socket.create_connection(('127.0.0.1', %d), 1)\n"
                    "  print('open')\nexcept OSError:\n  pass\n" % agent_port)
            return in_netns(netns["name"], code) == "open"

        until("gsaasd to be ready (/readyz)", lambda: (get("/readyz") or {}).get("status") == "ready", logs)
        until("the agent's port to open", agent_open, logs)
        config = os.path.join(workdir, "admin.toml")
        with open(config, "w") as f:
            f.write('[auth]\nsigning_key = "%s"\n' % signing_key)
        token = subprocess.run([os.path.join(bin_dir, "gsaasd"), "token", "issue", "--role", "admin",
                                "--project", "ops", "-c", config],
                               capture_output=True, text=True, check=True).stdout.strip()

        def registered():
            hosts = (get("/v1/hosts", token) or {}).get("hosts", [])
            return next((h for h in hosts if h["name"] == node and h["state"] == "schedulable"), None)

        host = until("the agent to register its node", registered, logs)
        seen = time.time() * 1000

        def reconciled():
            reconciler = (get("/readyz") or {}).get("reconciler", {})
            last = reconciler.get("last_pass_ms") or 0
            if last > seen and reconciler.get("last_error"):
                fail("gsaasd's reconciler could not reach the agent: %s" % reconciler)
            return last > seen

        until("a reconciler pass that reaches the agent", reconciled, logs)

        # The agent serves VMs their environment where the rendered config says; this caller is
        # no VM of the node and gets none (404; 503 before the agent has a route table).
        agent_toml = next(d["data"]["agent.toml.in"] for d in docs
                          if d["kind"] == "ConfigMap" and "agent.toml.in" in d.get("data", {}))
        listen = re.search(r'^metadata_listen = "__NODE_IP__:(\d+)"$', agent_toml, re.M)
        if not listen:
            fail("the rendered agent config has no metadata_listen on the node's address")
        code = (
            "import urllib.request, urllib.error\n"
            "try:\n  urllib.request.urlopen('http://127.0.0.1:%s/rcuda.env', timeout=2)\n"
            "  print(200)\nexcept urllib.error.HTTPError as e:\n  print(e.code)\n"
            "except Exception:\n  pass\n" % listen.group(1)
        )
        until("the agent's metadata listener to refuse a caller that is no VM",
              lambda: in_netns(netns["name"], code) in ("404", "503"), logs)
        print("helm-run: gsaasd and the agent of %s run as rendered; %s registered at %s"
              % (node, node, host["agent_url"]))
    finally:
        for process, _ in processes:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait()
        subprocess.run(["ip", "netns", "del", netns["name"]])
        subprocess.run(["umount", "-R", workdir], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
