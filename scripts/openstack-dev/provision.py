"""Fills the fresh Keystone, Glance and Nova of scripts/openstack-dev.sh (Python standard library).

Idempotent: each object is looked up by name first and created only when missing, so a half-done
start can run it again. Creates:
- project `service` with the users nova, placement, glance (roles admin + service), the services
  Nova and the others authenticate with;
- the catalog: compute, placement, image, and network (the Neutron stand-in); and GSaaS itself,
  service `gsaas` of type `gpu-scheduling` with a public and an internal endpoint, as an operator
  registers it (docs/operator/openstack.md, "Registering GSaaS in the catalog");
- projects `alpha` and `beta`, each with a member user (`alpha-member`, `beta-member`);
  `alpha-lab`, a second project of `alpha-member` (a project to switch to); and `alpha-reader`,
  with Keystone's reader role in alpha only;
- a public Glance image (a tiny raw file), a private one of project beta (`gsaas-beta-private`),
  and a Nova flavor;
- an availability zone per compute host, `gsaas-<host>` (a host aggregate of that one host).

Usage: provision.py identity|content|zones   (environment: see `need` below). `identity` (Keystone
only) runs before the other services start, since they authenticate as their service users;
`content` (the images and flavor) needs Glance and Nova up; `zones` needs the compute hosts
registered.
"""

import json
import os
import sys
import urllib.error
import urllib.request

ENV = os.environ


def need(name):
    value = ENV.get(name)
    if not value:
        sys.exit("provision.py: %s is not set" % name)
    return value


KEYSTONE = need("GSAAS_OS_AUTH_URL").rstrip("/")
ADMIN_PASSWORD = need("GSAAS_OS_ADMIN_PASSWORD")
SERVICE_PASSWORD = need("GSAAS_OS_SERVICE_PASSWORD")
TENANT_PASSWORD = {"alpha": need("GSAAS_OS_ALPHA_PASSWORD"), "beta": need("GSAAS_OS_BETA_PASSWORD")}
READER_PASSWORD = need("GSAAS_OS_READER_PASSWORD")
# GSaaS's service type: see docs/operator/openstack.md, "Registering GSaaS in the catalog".
GSAAS_SERVICE = ("gpu-scheduling", "gsaas", need("GSAAS_OS_GSAAS_URL"))
ENDPOINTS = {
    "compute": ("nova", need("GSAAS_OS_NOVA_URL")),
    "placement": ("placement", need("GSAAS_OS_PLACEMENT_URL")),
    "image": ("glance", need("GSAAS_OS_GLANCE_URL")),
    "network": ("neutron", need("GSAAS_OS_NEUTRON_URL")),
}
IMAGE_NAME, IMAGE_FILE = need("GSAAS_OS_IMAGE_NAME"), need("GSAAS_OS_IMAGE_FILE")
FLAVOR_NAME = need("GSAAS_OS_FLAVOR_NAME")
BETA_PRIVATE_IMAGE = "gsaas-beta-private"
TIMEOUT = 60


def call(method, url, token=None, body=None, raw=None, headers=None, ok=(200, 201, 202, 204)):
    all_headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        all_headers["Content-Type"] = "application/json"
    if raw is not None:
        data = raw
        all_headers["Content-Type"] = "application/octet-stream"
    if token:
        all_headers["X-Auth-Token"] = token
    all_headers.update(headers or {})
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            text = answer.read()
            return answer.status, answer.headers, (json.loads(text) if text.strip() else None)
    except urllib.error.HTTPError as e:
        if e.code in ok:
            return e.code, e.headers, None
        sys.exit("provision.py: %s %s -> %s %s" % (method, url, e.code, e.read()[:500].decode()))


def project_token(user, password, project):
    body = {"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": user, "domain": {"id": "default"}, "password": password}}},
        "scope": {"project": {"name": project, "domain": {"id": "default"}}}}}
    _, headers, _ = call("POST", KEYSTONE + "/auth/tokens", body=body)
    return headers["X-Subject-Token"]


def admin_token():
    return project_token("admin", ADMIN_PASSWORD, "admin")


if len(sys.argv) != 2 or sys.argv[1] not in ("identity", "content", "zones"):
    sys.exit("usage: provision.py identity|content|zones")
PHASE = sys.argv[1]
TOKEN = admin_token()


def find_or_create(collection, key, name, create, query=""):
    """The id of the Keystone object `name` in /v3/<collection>, created from `create` if absent."""
    url = "%s/%s?name=%s%s" % (KEYSTONE, collection, urllib.request.quote(name), query)
    found = call("GET", url, TOKEN)[2][collection]
    if found:
        return found[0]["id"]
    return call("POST", "%s/%s" % (KEYSTONE, collection), TOKEN, {key: create})[2][key]["id"]


def grant(project, user, role):
    call("PUT", "%s/projects/%s/users/%s/roles/%s" % (KEYSTONE, project, user, role), TOKEN)


def identity():
    roles = {r: find_or_create("roles", "role", r, {"name": r})
             for r in ("admin", "member", "reader", "service")}
    service_project = find_or_create("projects", "project", "service",
                                     {"name": "service", "domain_id": "default"})
    for user in ("nova", "placement", "glance"):
        uid = find_or_create("users", "user", user, {
            "name": user, "password": SERVICE_PASSWORD, "domain_id": "default",
            "default_project_id": service_project})
        for role in ("admin", "service"):
            grant(service_project, uid, roles[role])

    for kind, (name, url) in ENDPOINTS.items():
        sid = find_or_create("services", "service", name, {"name": name, "type": kind})
        existing = call("GET", "%s/endpoints?service_id=%s" % (KEYSTONE, sid), TOKEN)[2]["endpoints"]
        have = {e["interface"] for e in existing}
        for interface in ("public", "internal", "admin"):
            if interface not in have:
                call("POST", KEYSTONE + "/endpoints", TOKEN, {"endpoint": {
                    "service_id": sid, "interface": interface, "url": url,
                    "region_id": "RegionOne"}})

    kind, name, url = GSAAS_SERVICE
    sid = find_or_create("services", "service", name, {
        "name": name, "type": kind, "description": "GPU scheduling as a service (GSaaS)"})
    existing = call("GET", "%s/endpoints?service_id=%s" % (KEYSTONE, sid), TOKEN)[2]["endpoints"]
    have = {e["interface"] for e in existing}
    for interface in ("public", "internal"):
        if interface not in have:
            call("POST", KEYSTONE + "/endpoints", TOKEN, {"endpoint": {
                "service_id": sid, "interface": interface, "url": url, "region_id": "RegionOne"}})

    for tenant, password in TENANT_PASSWORD.items():
        pid = find_or_create("projects", "project", tenant, {"name": tenant, "domain_id": "default"})
        uid = find_or_create("users", "user", tenant + "-member", {
            "name": tenant + "-member", "password": password, "domain_id": "default",
            "default_project_id": pid})
        grant(pid, uid, roles["member"])
        if tenant == "alpha":
            lab = find_or_create("projects", "project", "alpha-lab",
                                 {"name": "alpha-lab", "domain_id": "default"})
            grant(lab, uid, roles["member"])
            # A reader of alpha (Keystone's reader role only): for operators' policy files.
            reader = find_or_create("users", "user", "alpha-reader", {
                "name": "alpha-reader", "password": READER_PASSWORD, "domain_id": "default",
                "default_project_id": pid})
            grant(pid, reader, roles["reader"])


def image(token, name, visibility):
    """The active image `name` as `token` sees it: created (then its bytes uploaded, Glance's
    two-step v2 upload) when missing."""
    glance = ENDPOINTS["image"][1].rstrip("/")
    images = call("GET", "%s/v2/images?name=%s" % (glance, name), token)[2]["images"]
    found = next((i for i in images if i["status"] == "active"), None)
    if found is None:
        found = images[0] if images else call("POST", glance + "/v2/images", token, {
            "name": name, "disk_format": "raw", "container_format": "bare",
            "visibility": visibility})[2]
        with open(IMAGE_FILE, "rb") as f:
            call("PUT", "%s/v2/images/%s/file" % (glance, found["id"]), token, raw=f.read())
    return found


def content():
    public = image(TOKEN, IMAGE_NAME, "public")
    # Beta's own: another tenant must not be able to boot it.
    beta = project_token("beta-member", TENANT_PASSWORD["beta"], "beta")
    image(beta, BETA_PRIVATE_IMAGE, "private")

    nova = ENDPOINTS["compute"][1].rstrip("/")
    flavors = call("GET", nova + "/flavors", TOKEN)[2]["flavors"]
    if not any(f["name"] == FLAVOR_NAME for f in flavors):
        call("POST", nova + "/flavors", TOKEN, {"flavor": {
            "name": FLAVOR_NAME, "id": FLAVOR_NAME, "ram": 64, "vcpus": 1, "disk": 1}})
    print("image %s, flavor %s" % (public["id"], FLAVOR_NAME))


def zones():
    nova = ENDPOINTS["compute"][1].rstrip("/")
    aggregates = call("GET", nova + "/os-aggregates", TOKEN)[2]["aggregates"]
    for host in need("GSAAS_OS_COMPUTE_HOSTS").split():
        zone = "gsaas-" + host
        aggregate = next((a for a in aggregates if a["name"] == zone), None)
        if aggregate is None:
            aggregate = call("POST", nova + "/os-aggregates", TOKEN, {"aggregate": {
                "name": zone, "availability_zone": zone}})[2]["aggregate"]
        if host not in (aggregate.get("hosts") or []):
            call("POST", "%s/os-aggregates/%s/action" % (nova, aggregate["id"]), TOKEN,
                 {"add_host": {"host": host}}, ok=(200, 409))
    print("zones", need("GSAAS_OS_COMPUTE_HOSTS"))


{"identity": identity, "content": content, "zones": zones}[PHASE]()
