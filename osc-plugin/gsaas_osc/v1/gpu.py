"""`openstack gpu gpu taint|untaint` (admins): keep new cGPUs off a GPU, or let them back."""

from osc_lib.command import command

from gsaas_osc.v1 import common


class TaintGpu(command.ShowOne):
    """Taint a GPU: it takes no new cGPUs (those it has stay)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("gpu", metavar="<gpu>", help="The GPU's id (<host>:<id>)")
        parser.add_argument("--reason", required=True, help="Why (shown to operators)")
        return parser

    def take_action(self, args):
        path = "/v1/gpus/%s/taint" % common.segment(args.gpu)
        gpu = self.app.client_manager.gpu.post(path, {"reason": args.reason})
        return ("id", "taint"), (gpu.get("id"), gpu.get("taint"))


class UntaintGpu(command.ShowOne):
    """Untaint a GPU."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("gpu", metavar="<gpu>", help="The GPU's id (<host>:<id>)")
        return parser

    def take_action(self, args):
        path = "/v1/gpus/%s/untaint" % common.segment(args.gpu)
        gpu = self.app.client_manager.gpu.post(path)
        return ("id", "taint"), (gpu.get("id"), gpu.get("taint"))
