"""gsaasd's REST API, called with the signed-in user's Keystone token at gsaasd's endpoint in
the user's catalog (service type `gpu-scheduling`), as manila-ui calls Manila.

gsaasd's refusals (RFC 9457 problem documents) become `GsaasError`s carrying gsaasd's message and
each invalid field, which the views show as Horizon messages or beside a form's fields.
"""

import urllib.parse

import requests
from django.conf import settings
from openstack_dashboard.api import base

SERVICE_TYPE = "gpu-scheduling"
TIMEOUT_SECS = 30


class GsaasError(Exception):
    def __init__(self, status, detail, fields=None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.fields = fields or []

    def __str__(self):
        if len(self.fields) > 1:
            return "; ".join("%s: %s" % (f.get("field"), f.get("detail")) for f in self.fields)
        return self.detail


def _segment(value):
    return urllib.parse.quote(str(value), safe="")


def _call(request, method, path, body=None):
    url = base.url_for(request, SERVICE_TYPE).rstrip("/") + path
    verify = getattr(settings, "OPENSTACK_SSL_CACERT", None) or not getattr(
        settings, "OPENSTACK_SSL_NO_VERIFY", False)
    try:
        response = requests.request(
            method, url, json=body, timeout=TIMEOUT_SECS, verify=verify,
            headers={"X-Auth-Token": request.user.token.id, "Accept": "application/json"})
    except requests.RequestException as e:
        raise GsaasError(503, "cannot reach the GPU service: %s" % e)
    if response.status_code >= 400:
        try:
            doc = response.json()
        except ValueError:
            doc = {}
        detail = doc.get("detail") or doc.get("title") or "HTTP %d" % response.status_code
        raise GsaasError(response.status_code, detail, doc.get("errors"))
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


# ---- tenants ----

def vm_list(request, project_id=None):
    """The VMs gsaasd lists the user (an admin: every project's, or `project_id`'s)."""
    vms, path = [], "/v1/vms"
    if project_id:
        path += "?project=%s" % _segment(project_id)
    while path:
        page = _call(request, "GET", path)
        vms.extend(page.get("vms") or [])
        path = page.get("next")
    return vms


def vm_get(request, vm_id):
    return _call(request, "GET", "/v1/vms/%s" % _segment(vm_id))


def vm_launch(request, body):
    return _call(request, "POST", "/v1/vms", body)


def vm_terminate(request, vm_id):
    return _call(request, "DELETE", "/v1/vms/%s" % _segment(vm_id))


def cgpu_attach(request, vm_id, body):
    return _call(request, "POST", "/v1/vms/%s/cgpus" % _segment(vm_id), body)


def cgpu_detach(request, vm_id, index):
    return _call(request, "DELETE", "/v1/vms/%s/cgpus/%d" % (_segment(vm_id), int(index)))


def quota_get(request, project_id):
    return _call(request, "GET", "/v1/quotas/%s" % _segment(project_id))


# ---- operators ----

def pool_get(request):
    pool = _call(request, "GET", "/v1/pool")
    hosts, path = list(pool.get("hosts") or []), pool.get("next")
    while path:
        page = _call(request, "GET", path)
        hosts.extend(page.get("hosts") or [])
        path = page.get("next")
    pool["hosts"] = hosts
    return pool


def queue_get(request):
    return _call(request, "GET", "/v1/queue")


def host_list(request):
    return _call(request, "GET", "/v1/hosts").get("hosts") or []


def host_drain(request, host, drained):
    action = "drain" if drained else "undrain"
    return _call(request, "POST", "/v1/hosts/%s/%s" % (_segment(host), action), {})


def gpu_taint(request, gpu, reason):
    return _call(request, "POST", "/v1/gpus/%s/taint" % _segment(gpu), {"reason": reason})


def gpu_untaint(request, gpu):
    return _call(request, "POST", "/v1/gpus/%s/untaint" % _segment(gpu), {})
