"""The tenant's VMs with cGPUs: states followed live (rows of unsettled VMs refresh themselves),
launch, attach, detach and terminate."""

from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

from horizon import tables

from gsaas_dashboard import api

# Settled states; rows in any other state are polled until they settle.
STATUS_CHOICES = (("ready", True), ("deleted", True), ("error", False))


def _gpus(vm, key):
    return (vm.get("gpus") or {}).get(key)


def cgpus_text(vm):
    """Each cGPU as `#index state masked-endpoint`: where the GPU is stays hidden."""
    return ", ".join("#%s %s %s" % (c.get("index"), c.get("state"), c.get("masked_endpoint"))
                     for c in vm.get("cgpus") or []) or "-"


def borrowed_text(vm):
    """The cGPUs on loan from the project's cohort (past its quota: they may be taken back)."""
    return ", ".join("#%s" % c.get("index") for c in vm.get("cgpus") or []
                     if c.get("borrowed")) or "-"


class LaunchVm(tables.LinkAction):
    name = "launch"
    verbose_name = _("Launch VM with GPUs")
    url = "horizon:project:gpus:launch"
    classes = ("ajax-modal",)
    icon = "plus"


class AttachCgpus(tables.LinkAction):
    name = "attach"
    verbose_name = _("Attach cGPUs")
    classes = ("ajax-modal",)

    def get_link_url(self, datum):
        return reverse("horizon:project:gpus:attach", args=[datum["id"]])

    def allowed(self, request, datum=None):
        return datum is not None and datum.get("state") == "ready"


class DetachCgpu(tables.LinkAction):
    name = "detach"
    verbose_name = _("Detach a cGPU")
    classes = ("ajax-modal",)

    def get_link_url(self, datum):
        return reverse("horizon:project:gpus:detach", args=[datum["id"]])

    def allowed(self, request, datum=None):
        return (datum is not None and datum.get("state") == "ready"
                and any(c.get("state") == "live" for c in datum.get("cgpus") or []))


class TerminateVm(tables.DeleteAction):
    name = "terminate"

    @staticmethod
    def action_present(count):
        return ngettext_lazy("Terminate VM", "Terminate VMs", count)

    @staticmethod
    def action_past(count):
        return ngettext_lazy("Terminated VM", "Terminated VMs", count)

    def allowed(self, request, datum=None):
        return datum is None or datum.get("state") not in ("deleting", "deleted")

    def delete(self, request, obj_id):
        api.vm_terminate(request, obj_id)


class UpdateRow(tables.Row):
    ajax = True

    def get_data(self, request, vm_id):
        return api.vm_get(request, vm_id)


class VmTable(tables.DataTable):
    name = tables.Column("name", verbose_name=_("Name"))
    state = tables.Column("state", verbose_name=_("State"), status=True,
                          status_choices=STATUS_CHOICES)
    ncgpus = tables.Column(lambda vm: _gpus(vm, "ncgpus"), verbose_name=_("cGPUs"))
    mode = tables.Column(lambda vm: _gpus(vm, "mode"), verbose_name=_("Mode"))
    memory = tables.Column(lambda vm: _gpus(vm, "gpu_memory_mib") or "-",
                           verbose_name=_("GPU memory (MiB)"))
    cgpus = tables.Column(cgpus_text, verbose_name=_("cGPUs (masked endpoints)"))
    borrowed = tables.Column(borrowed_text, verbose_name=_("Borrowed cGPUs"),
                             classes=("gsaas-borrowed",),
                             help_text=_("On loan from your project's cohort, past its quota: "
                                         "they may be taken back when their owners need them."))
    vm_id = tables.Column("id", verbose_name=_("ID"))

    def get_object_id(self, datum):
        return datum["id"]

    def get_object_display(self, datum):
        return datum.get("name") or datum["id"]

    class Meta:
        name = "vms"
        verbose_name = _("VMs with GPUs")
        status_columns = ["state"]
        row_class = UpdateRow
        table_actions = (LaunchVm, TerminateVm)
        row_actions = (AttachCgpus, DetachCgpu, TerminateVm)
