from django.urls import reverse_lazy
from django.utils.translation import gettext_lazy as _

from horizon import exceptions
from horizon import forms
from horizon import tables

from gsaas_dashboard import api
from gsaas_dashboard.content.admin.gpus import forms as admin_forms
from gsaas_dashboard.content.admin.gpus import tables as admin_tables


class IndexView(tables.MultiTableView):
    table_classes = (admin_tables.HostsTable, admin_tables.GpusTable, admin_tables.QueueTable)
    template_name = "gsaas_dashboard/admin/gpus/index.html"
    page_title = _("GPU Pool")

    def pool(self):
        if not hasattr(self, "_pool"):
            try:
                self._pool = api.pool_get(self.request)
            except api.GsaasError as e:
                exceptions.handle(self.request, _("Unable to read the GPU pool: %s") % e)
                self._pool = {"hosts": [], "totals": {}}
        return self._pool

    def get_hosts_data(self):
        return self.pool()["hosts"]

    def get_gpus_data(self):
        return [dict(gpu, host=host["name"]) for host in self.pool()["hosts"]
                for gpu in host.get("gpus") or []]

    def get_queue_data(self):
        try:
            return api.queue_get(self.request).get("requests") or []
        except api.GsaasError as e:
            exceptions.handle(self.request, _("Unable to read the queue: %s") % e)
            return []

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["totals"] = self.pool().get("totals") or {}
        return context


class TaintView(forms.ModalFormView):
    form_class = admin_forms.TaintForm
    template_name = "gsaas_dashboard/admin/gpus/taint.html"
    modal_id = "taint_gpu_modal"
    modal_header = _("Taint a GPU")
    submit_label = _("Taint")
    success_url = reverse_lazy("horizon:admin:gpus:index")
    page_title = _("Taint a GPU")

    def get_initial(self):
        return {"gpu_id": self.kwargs["gpu_id"]}

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["submit_url"] = reverse_lazy("horizon:admin:gpus:taint",
                                             args=[self.kwargs["gpu_id"]])
        context["gpu_id"] = self.kwargs["gpu_id"]
        return context
