from django.utils.translation import gettext_lazy as _

from horizon import forms
from horizon import messages

from gsaas_dashboard import api


class TaintForm(forms.SelfHandlingForm):
    gpu_id = forms.CharField(widget=forms.HiddenInput())
    reason = forms.CharField(max_length=255, label=_("Reason"),
                             help_text=_("Why no new cGPU should go to this GPU"))

    def handle(self, request, data):
        try:
            gpu = api.gpu_taint(request, data["gpu_id"], data["reason"])
        except api.GsaasError as e:
            self.api_error(str(e))
            return False
        messages.success(request, _("Tainted GPU %s.") % data["gpu_id"])
        return gpu
