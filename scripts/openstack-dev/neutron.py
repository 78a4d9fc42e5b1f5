"""A small Neutron stand-in for scripts/openstack-dev.sh (Python standard library only).

Nova itself always talks to Neutron, even for servers booted with `networks: "none"`: the API lists
a server's ports for its security groups, and nova-compute lists (and deletes) them when a server
is deleted. gsaasd asks Neutron for the VM's port (`GET /v2.0/ports?device_id=<server>`) to learn
its fixed IP and tap device, and waits for the port to be ACTIVE.

There is no real network here, so the stand-in gives each server that Nova has placed on a host
one port, in the shape of Neutron's API reference (`ports_ports-list-response.json` plus the
port-binding extension's `binding:*` fields): a stable id, MAC and fixed IP from SUBNET_CIDR, and
`binding:host_id` = the host Nova really placed the server on. The host is read from Nova as admin
(`GET /os-hypervisors/detail?with_servers=true`, 2.53), not from the server itself: showing a
server makes nova-api list its ports here, which would call back into Nova. A server Nova has not
placed yet has no port. Deleting a port forgets it (Nova does that when it deletes the server).
Updating a port keeps its binding fields (Nova does that while it live-migrates the server).

Networks are authorized as Neutron does: each of the projects alpha and beta owns one network
(alpha-net, beta-net; ids from uuid5 of their names), and `GET /v2.0/networks` (by name) and
`GET /v2.0/networks/<id>` show a caller only its own project's networks (all of them to the admin
role), the caller being whoever Keystone says its X-Auth-Token is.
Every other collection is an empty list, and every other item is Neutron's 404.

Usage: neutron.py PORT   (environment: GSAAS_OS_AUTH_URL, GSAAS_OS_ADMIN_PASSWORD)
"""

import ipaddress
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SUBNET_CIDR = ipaddress.ip_network("10.201.0.0/16")
# Stable ids for the stand-in's one network and subnet (uuid5 of a fixed name).
NETWORK_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "gsaas-openstack-dev/network"))
SUBNET_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "gsaas-openstack-dev/subnet"))
TIMEOUT = 10  # seconds for one request to Keystone or Nova

AUTH_URL = os.environ["GSAAS_OS_AUTH_URL"].rstrip("/")
ADMIN_PASSWORD = os.environ["GSAAS_OS_ADMIN_PASSWORD"]

lock = threading.Lock()
ports = {}  # device (server) id -> port
project_networks = []  # each tenant project's network, once the projects' ids are known
callers = {}  # token -> (project id, admin?, until when cached)
next_host_number = [10]  # the next address of SUBNET_CIDR to hand out
token = {"value": None, "expires": 0.0, "nova": None}


def admin_token():
    """The admin's project-scoped token and Nova's public endpoint, renewed every 30 minutes."""
    with lock:
        if token["value"] and time.time() < token["expires"]:
            return token["value"], token["nova"]
    body = {"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": "admin", "domain": {"id": "default"}, "password": ADMIN_PASSWORD}}},
        "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}}
    request = urllib.request.Request(
        AUTH_URL + "/auth/tokens", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        value = answer.headers["X-Subject-Token"]
        catalog = json.load(answer)["token"]["catalog"]
    nova = next(e["url"] for s in catalog if s["type"] == "compute"
                for e in s["endpoints"] if e["interface"] == "public")
    with lock:
        token.update(value=value, expires=time.time() + 1800, nova=nova)
    return value, nova


def keystone_get(path, subject=None):
    value, _ = admin_token()
    headers = {"X-Auth-Token": value, "Accept": "application/json"}
    if subject:
        headers["X-Subject-Token"] = subject
    request = urllib.request.Request(AUTH_URL + path, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        return json.load(answer)


def networks():
    """alpha-net and beta-net, each owned by the project of that name."""
    with lock:
        if project_networks:
            return list(project_networks)
    found = []
    for project in ("alpha", "beta"):
        listed = keystone_get("/projects?name=" + project)["projects"]
        if not listed:
            continue
        pid, name = listed[0]["id"], project + "-net"
        found.append({
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, "gsaas-openstack-dev/" + name)), "name": name,
            "project_id": pid, "tenant_id": pid, "shared": False, "status": "ACTIVE",
            "admin_state_up": True, "subnets": [], "router:external": False, "mtu": 1500,
        })
    with lock:
        project_networks[:] = found
    return found


def caller(token):
    """(project id, admin?) of a Keystone token, or None for a token Keystone does not know."""
    if not token:
        return None
    with lock:
        known = callers.get(token)
        if known and known[2] > time.time():
            return known[:2]
    try:
        body = keystone_get("/auth/tokens?nocatalog", subject=token)["token"]
    except urllib.error.HTTPError:
        return None
    project = (body.get("project") or {}).get("id")
    admin = any(r.get("name") == "admin" for r in body.get("roles", []))
    with lock:
        callers[token] = (project, admin, time.time() + 60)
    return project, admin


def visible_networks(token):
    who = caller(token)
    if who is None:
        return []
    project, admin = who
    return [n for n in networks() if admin or n["project_id"] == project or n["shared"]]


def hosts_of_servers():
    """server id -> the host (nova-compute service) Nova placed it on."""
    value, nova = admin_token()
    request = urllib.request.Request(
        nova + "/os-hypervisors/detail?with_servers=true",
        headers={"X-Auth-Token": value, "OpenStack-API-Version": "compute 2.53",
                 "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        hypervisors = json.load(answer)["hypervisors"]
    return {server["uuid"]: hypervisor["service"]["host"]
            for hypervisor in hypervisors for server in hypervisor.get("servers") or []}


def port_for(device, host):
    """The device's port (created on first sight, then kept), bound to `host`."""
    with lock:
        port = ports.get(device)
        if port is None:
            number = next_host_number[0]
            next_host_number[0] += 1
            port_id = str(uuid.uuid4())
            mac = "fa:16:3e:%02x:%02x:%02x" % (number >> 16 & 0xff, number >> 8 & 0xff, number & 0xff)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            port = {
                "admin_state_up": True, "allowed_address_pairs": [], "created_at": now,
                "data_plane_status": None, "description": "", "device_id": device,
                "device_owner": "compute:nova", "dns_assignment": [], "dns_domain": "",
                "dns_name": "", "extra_dhcp_opts": [],
                "fixed_ips": [{"ip_address": str(SUBNET_CIDR[number]), "subnet_id": SUBNET_ID}],
                "id": port_id, "ip_allocation": "immediate", "mac_address": mac, "name": "",
                "network_id": NETWORK_ID, "project_id": "", "revision_number": 1,
                "security_groups": [], "status": "ACTIVE", "tags": [], "tenant_id": "",
                "updated_at": now, "port_security_enabled": False,
                "binding:host_id": host, "binding:profile": {}, "binding:vif_details": {},
                "binding:vif_type": "ovs", "binding:vnic_type": "normal",
            }
            ports[device] = port
        port["binding:host_id"] = host
        return dict(port)


class Handler(BaseHTTPRequestHandler):
    def send_json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def not_found(self, what):
        self.send_json(404, {"NeutronError": {"type": "NotFound", "message": what, "detail": ""}})

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        path = url.path.rstrip("/")
        query = urllib.parse.parse_qs(url.query)
        if path in ("", "/"):
            href = "http://%s/v2.0/" % self.headers.get("Host")
            return self.send_json(200, {"versions": [
                {"id": "v2.0", "status": "CURRENT", "links": [{"rel": "self", "href": href}]}]})
        parts = path.split("/")[1:]  # ["v2.0", collection, (id)]
        if parts[:1] != ["v2.0"] or len(parts) < 2:
            return self.not_found("no resource %s" % path)
        collection = parts[1].removesuffix(".json")
        if collection == "networks":
            try:
                visible = visible_networks(self.headers.get("X-Auth-Token"))
            except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
                return self.send_json(503, {"NeutronError": {
                    "type": "ServiceUnavailable", "message": "cannot ask Keystone: %s" % e,
                    "detail": ""}})
            if len(parts) == 3:
                wanted = parts[2].removesuffix(".json")
                found = next((n for n in visible if n["id"] == wanted), None)
                if found is None:
                    return self.not_found("Network %s could not be found." % wanted)
                return self.send_json(200, {"network": found})
            names = query.get("name")
            if names:
                visible = [n for n in visible if n["name"] in names]
            return self.send_json(200, {"networks": visible})
        if collection == "quotas" and len(parts) == 3:
            return self.send_json(200, {"quota": {"port": -1, "network": -1, "subnet": -1,
                                                  "security_group": -1}})
        if collection == "ports" and len(parts) == 2:
            devices = query.get("device_id", [])
            if not devices:
                with lock:
                    return self.send_json(200, {"ports": list(ports.values())})
            try:
                hosts = hosts_of_servers()
            except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
                return self.send_json(503, {"NeutronError": {
                    "type": "ServiceUnavailable", "message": "cannot ask Nova: %s" % e,
                    "detail": ""}})
            found = [port_for(d, hosts[d]) for d in devices if d in hosts]
            fields = query.get("fields")
            if fields:
                found = [{k: v for k, v in p.items() if k in fields} for p in found]
            return self.send_json(200, {"ports": found})
        if len(parts) == 2:
            return self.send_json(200, {collection.replace("-", "_"): []})
        return self.not_found("%s %s could not be found" % (collection, parts[2]))

    def do_DELETE(self):
        parts = urllib.parse.urlsplit(self.path).path.rstrip("/").split("/")[1:]
        if parts[:2] == ["v2.0", "ports"] and len(parts) == 3:
            port_id = parts[2].removesuffix(".json")
            with lock:
                for device, port in list(ports.items()):
                    if port["id"] == port_id:
                        del ports[device]
                        break
                else:
                    return self.not_found("Port %s could not be found." % port_id)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self.not_found("no resource %s" % self.path)

    def do_POST(self):
        self.not_found("this Neutron stand-in creates nothing")

    def do_PUT(self):
        """A port update: what Nova sends while it live-migrates a server (the binding's profile
        and host). The fields given are kept; `binding:host_id` is Nova's placement again at the
        next GET."""
        parts = urllib.parse.urlsplit(self.path).path.rstrip("/").split("/")[1:]
        if parts[:2] != ["v2.0", "ports"] or len(parts) != 3:
            return self.not_found("this Neutron stand-in updates only ports")
        port_id = parts[2].removesuffix(".json")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            update = json.loads(self.rfile.read(length) or b"{}").get("port") or {}
        except ValueError:
            return self.send_json(400, {"NeutronError": {
                "type": "BadRequest", "message": "the body is not JSON", "detail": ""}})
        with lock:
            port = next((p for p in ports.values() if p["id"] == port_id), None)
            if port is None:
                return self.not_found("Port %s could not be found." % port_id)
            for key in ("binding:host_id", "binding:profile", "device_owner", "device_id"):
                if key in update:
                    port[key] = update[key]
            port["revision_number"] += 1
            answer = dict(port)
        return self.send_json(200, {"port": answer})

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
