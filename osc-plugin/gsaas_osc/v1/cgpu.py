"""`openstack gpu cgpu attach|detach`: grow or shrink a running VM's cGPUs."""

from osc_lib.command import command

from gsaas_osc.v1 import common


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
        parser.add_argument("--wait", action="store_true", help="Wait until they are live")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        body = {"ncgpus": args.ncgpus, "queue": args.queue}
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
