"""Project > GPUs > VMs with GPUs: the tenant's VMs with their cGPUs."""

from django.utils.translation import gettext_lazy as _

import horizon


class Gpus(horizon.Panel):
    name = _("VMs with GPUs")
    slug = "gpus"
    # Shown where the catalog has GSaaS.
    permissions = ("openstack.services.gpu-scheduling",)
