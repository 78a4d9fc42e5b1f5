# The GPUs panel group of the Project dashboard.
from django.utils.translation import gettext_lazy as _

PANEL_GROUP = "gpus"
PANEL_GROUP_NAME = _("GPUs")
PANEL_GROUP_DASHBOARD = "project"
