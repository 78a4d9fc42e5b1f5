"""Launch, attach and detach: every cGPU field of gsaasd's requests; gsaasd's refusals are
shown beside the field they name."""

from django.utils.translation import gettext_lazy as _

from horizon import exceptions
from horizon import forms
from horizon import messages
from openstack_dashboard import api as os_api

from gsaas_dashboard import api

MODES = (("exclusive", _("Exclusive: a whole GPU per cGPU")),
         ("shared", _("Shared: a share of a GPU's memory")))
LOCALITIES = (("any", _("Any")), ("local", _("Local: on a GPU host")),
              ("remote", _("Remote: on a host without GPUs")))


def _borrow_field():
    return forms.BooleanField(
        required=False, label=_("Borrow past the quota"),
        help_text=_("Past your project's quota, run on what its cohort's other projects leave "
                    "unused: those cGPUs are marked borrowed and may be taken back when their "
                    "owners need them. Unchecked: your project's setting in its cohort."))


def _borrow(body, data):
    """`borrow: true` when the box is checked; unchecked, `borrow` is left out so the project's
    default in its cohort applies."""
    if data.get("borrow"):
        body["borrow"] = True
    return body


def _refused(form, error):
    """Puts gsaasd's refusal beside the fields it names, or above the form."""
    placed = False
    for problem in error.fields:
        field = problem.get("field")
        if field in form.fields:
            form.add_error(field, problem.get("detail"))
            placed = True
    if not placed:
        form.api_error(str(error))
    return False


class LaunchForm(forms.SelfHandlingForm):
    name = forms.CharField(max_length=255, label=_("Name"))
    image = forms.ChoiceField(label=_("Image"))
    flavor = forms.ChoiceField(label=_("Flavor"))
    ncgpus = forms.IntegerField(min_value=1, initial=1, label=_("Number of cGPUs"))
    mode = forms.ChoiceField(choices=MODES, label=_("Mode"))
    gpu_memory_mib = forms.IntegerField(min_value=1, required=False,
                                        label=_("GPU memory per cGPU (MiB)"),
                                        help_text=_("Required when shared"))
    locality = forms.ChoiceField(choices=LOCALITIES, label=_("Locality"))
    queue = forms.BooleanField(required=False, label=_("Wait in the queue if GPUs are short"))
    borrow = _borrow_field()

    def __init__(self, request, *args, **kwargs):
        super().__init__(request, *args, **kwargs)
        try:
            images, _more, _prev = os_api.glance.image_list_detailed(request)
            self.fields["image"].choices = [
                (i.name, i.name) for i in images if i.status == "active" and i.name]
        except Exception:
            exceptions.handle(request, _("Unable to list the images."))
        try:
            self.fields["flavor"].choices = [
                (f.name, f.name) for f in os_api.nova.flavor_list(request)]
        except Exception:
            exceptions.handle(request, _("Unable to list the flavors."))

    def handle(self, request, data):
        body = {k: data[k] for k in ("name", "image", "flavor", "ncgpus", "mode", "locality")}
        body["queue"] = bool(data.get("queue"))
        if data.get("gpu_memory_mib"):
            body["gpu_memory_mib"] = data["gpu_memory_mib"]
        _borrow(body, data)
        try:
            vm = api.vm_launch(request, body)
        except api.GsaasError as e:
            return _refused(self, e)
        messages.success(request, _('Launching VM "%s" with %d cGPUs.') % (
            vm.get("name"), data["ncgpus"]))
        return vm


class AttachForm(forms.SelfHandlingForm):
    vm_id = forms.CharField(widget=forms.HiddenInput())
    ncgpus = forms.IntegerField(min_value=1, initial=1, label=_("cGPUs to attach"))
    gpu_memory_mib = forms.IntegerField(min_value=1, required=False,
                                        label=_("GPU memory per cGPU (MiB)"),
                                        help_text=_("Default: the VM's"))
    queue = forms.BooleanField(required=False, label=_("Wait in the queue if GPUs are short"))
    borrow = _borrow_field()

    def handle(self, request, data):
        body = {"ncgpus": data["ncgpus"], "queue": bool(data.get("queue"))}
        if data.get("gpu_memory_mib"):
            body["gpu_memory_mib"] = data["gpu_memory_mib"]
        _borrow(body, data)
        try:
            vm = api.cgpu_attach(request, data["vm_id"], body)
        except api.GsaasError as e:
            return _refused(self, e)
        messages.success(request, _("Attaching %d cGPUs.") % data["ncgpus"])
        return vm


class DetachForm(forms.SelfHandlingForm):
    vm_id = forms.CharField(widget=forms.HiddenInput())
    index = forms.ChoiceField(label=_("cGPU"))

    def __init__(self, request, *args, **kwargs):
        super().__init__(request, *args, **kwargs)
        vm = kwargs.get("initial", {}).get("vm") or {}
        self.fields["index"].choices = [
            (str(c["index"]), "#%s (%s)" % (c["index"], c.get("masked_endpoint")))
            for c in vm.get("cgpus") or [] if c.get("state") == "live"]

    def handle(self, request, data):
        try:
            vm = api.cgpu_detach(request, data["vm_id"], int(data["index"]))
        except api.GsaasError as e:
            return _refused(self, e)
        messages.success(request, _("Detaching cGPU #%s.") % data["index"])
        return vm
