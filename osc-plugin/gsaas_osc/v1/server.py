"""`openstack gpu server create|list|show|delete`: VMs with cGPUs."""

from osc_lib.command import command

from gsaas_osc.v1 import common


class CreateServer(command.ShowOne):
    """Launch a VM with cGPUs (the dissertation's `gsaas -l -ncgpus=N -poolmem=M -mode=...`)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("name", metavar="<name>", help="The VM's name")
        parser.add_argument("--ncgpus", type=int, required=True, help="How many cGPUs")
        parser.add_argument("--gpu-memory", type=int, metavar="<MiB>",
                            help="GPU memory per cGPU in MiB (required with --mode shared)")
        parser.add_argument("--mode", choices=("exclusive", "shared"), default="exclusive",
                            help="A whole GPU per cGPU, or a share of one (default exclusive)")
        parser.add_argument("--compute-percent", type=int, metavar="<percent>",
                            help="Shared mode: each cGPU's share of its GPU's SMs (1-100), "
                                 "held by MPS where a host runs it (default: time-sliced)")
        parser.add_argument("--locality", choices=("any", "local", "remote"), default="any",
                            help="Where the VM runs relative to its GPUs (default any)")
        parser.add_argument("--image", help="Image (default: the service's)")
        parser.add_argument("--flavor", help="Flavor (default: the service's)")
        parser.add_argument("--network", action="append", default=[], metavar="<network>",
                            help="A network (repeat for more)")
        parser.add_argument("--policy", help="Placement policy (default: the service's)")
        parser.add_argument("--queue", action="store_true",
                            help="Wait in the queue when GPUs are short, rather than fail")
        common.add_borrow_options(parser)
        parser.add_argument("--wait", action="store_true", help="Wait until the VM is ready")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        body = {"name": args.name, "ncgpus": args.ncgpus, "mode": args.mode,
                "locality": args.locality, "queue": args.queue}
        for key, value in (("gpu_memory_mib", args.gpu_memory), ("image", args.image),
                           ("flavor", args.flavor), ("policy", args.policy),
                           ("compute_percent", args.compute_percent)):
            if value is not None:
                body[key] = value
        if args.network:
            body["networks"] = args.network
        common.borrow_into(body, args)
        vm = client.post("/v1/vms", body)
        if args.wait:
            vm = common.wait_for(client, vm["id"], lambda v: v.get("state") == "ready")
        return common.vm_row(vm)


class ListServer(command.Lister):
    """List your project's VMs with cGPUs (admins: every project's)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--project", help="Admins: one project's VMs only")
        parser.add_argument("--state", help="Only VMs in this state")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        query = []
        if args.project:
            query.append("project=%s" % common.segment(args.project))
        if args.state:
            query.append("state=%s" % common.segment(args.state))
        vms, path = [], "/v1/vms" + ("?" + "&".join(query) if query else "")
        while path:
            page = client.get(path)
            vms.extend(page.get("vms") or [])
            path = page.get("next")
        columns = ("ID", "Name", "State", "Project", "cGPUs", "Borrowed", "Mode",
                   "GPU Memory (MiB)")
        rows = [
            (vm["id"], vm.get("name"), vm.get("state"), vm.get("project"),
             (vm.get("gpus") or {}).get("ncgpus"), len(common.borrowed_indexes(vm)),
             (vm.get("gpus") or {}).get("mode"), (vm.get("gpus") or {}).get("gpu_memory_mib"))
            for vm in vms
        ]
        return columns, rows


class ShowServer(command.ShowOne):
    """Show a VM: state, cGPUs at their masked addresses, its request."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("vm", metavar="<vm>", help="The VM's id")
        return parser

    def take_action(self, args):
        return common.vm_row(self.app.client_manager.gpu.get(common.vm_path(args.vm)))


class DeleteServer(command.Command):
    """Terminate VMs with cGPUs: their servers go, their GPUs are given back."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("vms", metavar="<vm>", nargs="+", help="The VMs' ids")
        parser.add_argument("--wait", action="store_true", help="Wait until they are deleted")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        for vm in args.vms:
            client.delete(common.vm_path(vm))
        if args.wait:
            for vm in args.vms:
                common.wait_for(client, vm, lambda v: v.get("state") == "deleted")
