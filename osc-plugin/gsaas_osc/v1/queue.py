"""`openstack gpu queue list`: what waits for GPU capacity, in serving order."""

from osc_lib.command import command


class ListQueue(command.Lister):
    """List the requests waiting for GPUs (yours; admins: everyone's), in the order they are
    served."""

    def take_action(self, args):
        queue = self.app.client_manager.gpu.get("/v1/queue")
        columns = ("Position", "VM", "VM Name", "Kind", "Project", "Priority", "cGPUs")
        rows = [
            (r.get("position"), r.get("vm"), r.get("vm_name"), r.get("kind"), r.get("project"),
             r.get("priority"), r.get("ncgpus"))
            for r in queue.get("requests") or []
        ]
        return columns, rows
