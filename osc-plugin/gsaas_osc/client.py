"""gsaasd's REST API through the keystoneauth session OSC gives the plugin.

The session adds the user's token (`X-Auth-Token`) to every request and finds gsaasd's URL in
the catalog by service type, interface and region, as every OpenStack client finds its service.
gsaasd's refusals (RFC 9457 problem documents) become `CommandError`s that say what gsaasd said,
every invalid field included, with the HTTP status and the problem's code for the commands
that tell a refusal from another (a cohort not there yet).
"""

from keystoneauth1 import exceptions as ks_exceptions
from osc_lib import exceptions

SERVICE_TYPE = "gpu-scheduling"


class GsaasError(exceptions.CommandError):
    """A refusal of gsaasd: what it said, its HTTP status and its problem's code."""

    def __init__(self, message, http_status, code=None):
        super().__init__(message)
        self.http_status = http_status
        self.code = code


class Client:
    def __init__(self, session, interface=None, region_name=None):
        self.session = session
        self.endpoint_filter = {
            "service_type": SERVICE_TYPE,
            "interface": interface or "public",
        }
        if region_name:
            self.endpoint_filter["region_name"] = region_name

    def endpoint(self):
        try:
            url = self.session.get_endpoint(**self.endpoint_filter)
        except ks_exceptions.EndpointNotFound:
            url = None
        if not url:
            raise exceptions.CommandError(
                "the service catalog has no %s endpoint (interface %s%s): is GSaaS registered "
                "in Keystone?" % (
                    SERVICE_TYPE,
                    self.endpoint_filter["interface"],
                    ", region %s" % self.endpoint_filter["region_name"]
                    if "region_name" in self.endpoint_filter else "",
                )
            )
        return url.rstrip("/")

    def request(self, method, path, body=None, ok=(200, 201, 202, 204), headers=None):
        url = self.endpoint() + path
        kwargs = {"raise_exc": False, "headers": dict({"Accept": "application/json"}, **(headers or {}))}
        if body is not None:
            kwargs["json"] = body
        try:
            response = self.session.request(url, method, **kwargs)
        except ks_exceptions.ConnectFailure as e:
            raise exceptions.CommandError("cannot reach gsaasd at %s: %s" % (url, e))
        if response.status_code not in ok:
            raise problem(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body=None):
        return self.request("POST", path, body if body is not None else {})

    def put(self, path, body, headers=None):
        return self.request("PUT", path, body, headers=headers)

    def delete(self, path, headers=None):
        return self.request("DELETE", path, headers=headers)


def problem(response):
    """The CommandError for a refusal: gsaasd's message, each invalid field, the status and the
    problem's code."""
    try:
        doc = response.json()
    except ValueError:
        doc = {"detail": response.text.strip()[:500]}
    message = doc.get("detail") or doc.get("title") or "HTTP %d" % response.status_code
    fields = doc.get("errors") or []
    if len(fields) > 1:
        message = "; ".join("%s: %s" % (f.get("field"), f.get("detail")) for f in fields)
    code = doc.get("code")
    return GsaasError(
        "%s (HTTP %d%s)" % (message, response.status_code, ", %s" % code if code else ""),
        response.status_code,
        code,
    )
