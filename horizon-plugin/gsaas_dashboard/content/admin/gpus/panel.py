"""Admin > GPUs > GPU Pool: the pool per host and GPU, the queue, drain and taint."""

from django.utils.translation import gettext_lazy as _

import horizon


class Gpus(horizon.Panel):
    name = _("GPU Pool")
    slug = "gpus"
    permissions = ("openstack.roles.admin", "openstack.services.gpu-scheduling")
