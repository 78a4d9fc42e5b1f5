"""The operators' tables: hosts (drain, undrain), GPUs (taint, untaint), the queue."""

from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

from horizon import tables

from gsaas_dashboard import api


class DrainHost(tables.BatchAction):
    name = "drain"
    classes = ("btn-danger",)

    @staticmethod
    def action_present(count):
        return ngettext_lazy("Drain Host", "Drain Hosts", count)

    @staticmethod
    def action_past(count):
        return ngettext_lazy("Drained Host", "Drained Hosts", count)

    def allowed(self, request, datum=None):
        return datum is None or datum.get("state") != "drained"

    def action(self, request, obj_id):
        api.host_drain(request, obj_id, True)


class UndrainHost(tables.BatchAction):
    name = "undrain"

    @staticmethod
    def action_present(count):
        return ngettext_lazy("Undrain Host", "Undrain Hosts", count)

    @staticmethod
    def action_past(count):
        return ngettext_lazy("Undrained Host", "Undrained Hosts", count)

    def allowed(self, request, datum=None):
        return datum is None or datum.get("state") == "drained"

    def action(self, request, obj_id):
        api.host_drain(request, obj_id, False)


class HostsTable(tables.DataTable):
    name = tables.Column("name", verbose_name=_("Host"))
    kind = tables.Column("kind", verbose_name=_("Kind"))
    state = tables.Column("state", verbose_name=_("State"))
    gpus = tables.Column(lambda h: len(h.get("gpus") or []), verbose_name=_("GPUs"))

    def get_object_id(self, datum):
        return datum["name"]

    def get_object_display(self, datum):
        return datum["name"]

    class Meta:
        name = "hosts"
        verbose_name = _("GPU hosts")
        row_actions = (DrainHost, UndrainHost)


class TaintGpu(tables.LinkAction):
    name = "taint"
    verbose_name = _("Taint GPU")
    classes = ("ajax-modal",)

    def get_link_url(self, datum):
        return reverse("horizon:admin:gpus:taint", args=[datum["id"]])

    def allowed(self, request, datum=None):
        return datum is not None and not datum.get("taint")


class UntaintGpu(tables.BatchAction):
    name = "untaint"

    @staticmethod
    def action_present(count):
        return ngettext_lazy("Untaint GPU", "Untaint GPUs", count)

    @staticmethod
    def action_past(count):
        return ngettext_lazy("Untainted GPU", "Untainted GPUs", count)

    def allowed(self, request, datum=None):
        return datum is None or bool(datum.get("taint"))

    def action(self, request, obj_id):
        api.gpu_untaint(request, obj_id)


def _taint(gpu):
    taint = gpu.get("taint")
    if not taint:
        return "-"
    return taint.get("reason") if isinstance(taint, dict) else str(taint)


class GpusTable(tables.DataTable):
    gpu_id = tables.Column("id", verbose_name=_("GPU"))
    host = tables.Column("host", verbose_name=_("Host"))
    model = tables.Column("model", verbose_name=_("Model"))
    memory = tables.Column("memory_mib", verbose_name=_("Memory (MiB)"))
    allocated = tables.Column("allocated_mib", verbose_name=_("Allocated (MiB)"))
    cgpus = tables.Column("cgpus", verbose_name=_("cGPUs"))
    taint = tables.Column(_taint, verbose_name=_("Taint"))

    def get_object_id(self, datum):
        return datum["id"]

    def get_object_display(self, datum):
        return datum["id"]

    class Meta:
        name = "gpus"
        verbose_name = _("GPUs")
        row_actions = (TaintGpu, UntaintGpu)


class QueueTable(tables.DataTable):
    position = tables.Column("position", verbose_name=_("Position"))
    vm_name = tables.Column("vm_name", verbose_name=_("VM"))
    project = tables.Column("project", verbose_name=_("Project"))
    kind = tables.Column("kind", verbose_name=_("Request"))
    priority = tables.Column("priority", verbose_name=_("Priority"))
    ncgpus = tables.Column("ncgpus", verbose_name=_("cGPUs"))

    def get_object_id(self, datum):
        return "%s-%s" % (datum.get("vm"), datum.get("position"))

    class Meta:
        name = "queue"
        verbose_name = _("Queue")
