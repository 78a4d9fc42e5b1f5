"""`openstack gpu cgpu list|attach|detach`: a VM's cGPUs; grow or shrink a running VM's."""

from osc_lib.command import command

from gsaas_osc.v1 import common


class ListCgpu(command.Lister):
    """List a VM's cGPUs: each one's state, masked address, share and whether it is on loan
    from the project's cohort (admins: and its GPU and host)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("vm", metavar="<vm>", help="The VM's id")
        return parser

    def take_action(self, args):
        vm = self.app.client_manager.gpu.get(common.vm_path(args.vm))
        cgpus = vm.get("cgpus") or []
        keys = ["index", "state", "masked_endpoint", "memory_mib", "mode", "compute_percent",
                "borrowed"]
        columns = ["Index", "State", "Masked Endpoint", "Memory (MiB)", "Mode",
                   "Compute (%)", "Borrowed"]
        # Where each cGPU really is: only in an admin's view.
        if any("gpu" in c for c in cgpus):
            keys += ["gpu", "host"]
            columns += ["GPU", "Host"]
        rows = [tuple(bool(c.get(k)) if k == "borrowed" else c.get(k) for k in keys)
                for c in cgpus]
        return tuple(columns), rows


class AttachCgpu(command.ShowOne):
    """Attach cGPUs to a ready VM."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("vm", metavar="<vm>", help="The VM's id")
        parser.add_argument("--ncgpus", type=int, required=True, help="How many cGPUs to add")
        parser.add_argument("--gpu-memory", type=int, metavar="<MiB>",
                            help="GPU memory per new cGPU (default: the VM's)")
        parser.add_argument("--mode", choices=("exclusive", "shared"),
                            help="Mode of the new cGPUs (default: the VM's)")
        parser.add_argument("--compute-percent", type=int, metavar="<percent>",
                            help="Shared mode: each new cGPU's share of its GPU's SMs (1-100)")
        parser.add_argument("--queue", action="store_true",
                            help="Wait in the queue when GPUs are short")
        common.add_borrow_options(parser)
        parser.add_argument("--wait", action="store_true", help="Wait until they are live")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        body = common.borrow_into({"ncgpus": args.ncgpus, "queue": args.queue}, args)
        if args.gpu_memory is not None:
            body["gpu_memory_mib"] = args.gpu_memory
        if args.mode is not None:
            body["mode"] = args.mode
        if args.compute_percent is not None:
            body["compute_percent"] = args.compute_percent
        vm = client.post(common.vm_path(args.vm) + "/cgpus", body)
        if args.wait:
            vm = common.wait_for(client, args.vm, common.settled)
        return common.vm_row(vm)


class DetachCgpu(command.ShowOne):
    """Detach one cGPU from a ready VM."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("vm", metavar="<vm>", help="The VM's id")
        parser.add_argument("index", type=int, metavar="<index>", help="The cGPU's index")
        parser.add_argument("--wait", action="store_true", help="Wait until it is gone")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        vm = client.delete("%s/cgpus/%d" % (common.vm_path(args.vm), args.index))
        if args.wait:
            vm = common.wait_for(client, args.vm, common.settled)
        return common.vm_row(vm)
