from django.urls import reverse_lazy
from django.utils.translation import gettext_lazy as _

from horizon import exceptions
from horizon import forms
from horizon import tables

from gsaas_dashboard import api
from gsaas_dashboard.content.project.gpus import forms as gpu_forms
from gsaas_dashboard.content.project.gpus import tables as gpu_tables

QUOTA_BARS = (("cgpus", _("cGPUs"), ""), ("memory_mib", _("GPU memory"), " MiB"),
              ("exclusive_gpus", _("Exclusive GPUs"), ""), ("vms", _("VMs with GPUs"), ""))


def quota_bars(quota):
    """The project's limits as bars: used of limit (no bar where there is no limit)."""
    bars = []
    for key, label, unit in QUOTA_BARS:
        used = (quota.get("usage") or {}).get(key) or 0
        limit = (quota.get("limits") or {}).get(key)
        percent = min(100, round(100 * used / limit)) if limit else 0
        bars.append({"key": key, "label": label, "used": used, "limit": limit, "unit": unit,
                     "percent": percent})
    return bars


class IndexView(tables.DataTableView):
    table_class = gpu_tables.VmTable
    template_name = "gsaas_dashboard/project/gpus/index.html"
    page_title = _("VMs with GPUs")

    def get_data(self):
        try:
            # The Project dashboard shows the project's VMs, an admin's included.
            return api.vm_list(self.request, self.request.user.project_id)
        except api.GsaasError as e:
            exceptions.handle(self.request, _("Unable to list the VMs: %s") % e)
            return []

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        try:
            quota = api.quota_get(self.request, self.request.user.project_id)
            context["quota_bars"] = quota_bars(quota)
            # Its cohort, if any, and what it holds past its limits on loan from it.
            context["quota_cohort"] = quota.get("cohort")
            context["quota_borrowed"] = quota.get("borrowed") or {}
        except api.GsaasError as e:
            exceptions.handle(self.request, _("Unable to read the quota: %s") % e)
        return context


class LaunchView(forms.ModalFormView):
    form_class = gpu_forms.LaunchForm
    template_name = "gsaas_dashboard/project/gpus/launch.html"
    modal_id = "launch_gpu_vm_modal"
    modal_header = _("Launch a VM with GPUs")
    submit_label = _("Launch")
    submit_url = reverse_lazy("horizon:project:gpus:launch")
    success_url = reverse_lazy("horizon:project:gpus:index")
    page_title = _("Launch a VM with GPUs")


class _VmFormView(forms.ModalFormView):
    success_url = reverse_lazy("horizon:project:gpus:index")

    def vm(self):
        if not hasattr(self, "_vm"):
            try:
                self._vm = api.vm_get(self.request, self.kwargs["vm_id"])
            except api.GsaasError as e:
                exceptions.handle(self.request, _("Unable to read the VM: %s") % e,
                                  redirect=self.success_url)
        return self._vm

    def get_initial(self):
        return {"vm_id": self.kwargs["vm_id"], "vm": self.vm()}

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["vm"] = self.vm()
        context["submit_url"] = reverse_lazy(self.submit_name, args=[self.kwargs["vm_id"]])
        return context


class AttachView(_VmFormView):
    form_class = gpu_forms.AttachForm
    template_name = "gsaas_dashboard/project/gpus/attach.html"
    modal_id = "attach_cgpus_modal"
    modal_header = _("Attach cGPUs")
    submit_label = _("Attach")
    submit_name = "horizon:project:gpus:attach"
    page_title = _("Attach cGPUs")


class DetachView(_VmFormView):
    form_class = gpu_forms.DetachForm
    template_name = "gsaas_dashboard/project/gpus/detach.html"
    modal_id = "detach_cgpu_modal"
    modal_header = _("Detach a cGPU")
    submit_label = _("Detach")
    submit_name = "horizon:project:gpus:detach"
    page_title = _("Detach a cGPU")
