"""How python-openstackclient loads this plugin (entry point group `openstack.cli.extension`).

OSC calls `make_client` with its client manager: its keystoneauth session carries the user's
token, whatever the credentials came from (`OS_*`, `--os-cloud`), and its catalog says where
gsaasd is. Commands are the entry points of `openstack.gpu.v1`.
"""

import logging

from osc_lib import utils

LOG = logging.getLogger(__name__)

API_NAME = "gpu"
API_VERSION_OPTION = "os_gpu_api_version"
DEFAULT_API_VERSION = "1"
API_VERSIONS = {"1": "gsaas_osc.client.Client"}


def make_client(instance):
    """A client of gsaasd's REST API, at gsaasd's endpoint in the catalog."""
    client_class = utils.get_client_class(API_NAME, instance._api_version[API_NAME], API_VERSIONS)
    LOG.debug("Instantiating GSaaS client: %s", client_class)
    return client_class(
        session=instance.session,
        interface=instance.interface,
        region_name=instance.region_name,
    )


def build_option_parser(parser):
    """Adds `--os-gpu-api-version` to OSC's global options."""
    parser.add_argument(
        "--os-gpu-api-version",
        metavar="<gpu-api-version>",
        default=utils.env("OS_GPU_API_VERSION", default=DEFAULT_API_VERSION),
        help="GSaaS API version, default=%s (Env: OS_GPU_API_VERSION)" % DEFAULT_API_VERSION,
    )
    return parser
