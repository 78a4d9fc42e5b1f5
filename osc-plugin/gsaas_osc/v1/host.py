"""`openstack gpu host list|drain|undrain|evacuate|forget` (admins)."""

from osc_lib.command import command

from gsaas_osc.v1 import common

HOST_COLUMNS = ("name", "kind", "state", "forgotten", "last_seen_ms", "routes_generation",
                "applied_generation")


def host_row(host):
    return HOST_COLUMNS, tuple(host.get(c) for c in HOST_COLUMNS)


class ListHost(command.Lister):
    """List the GPU hosts and their agents."""

    def take_action(self, args):
        hosts = self.app.client_manager.gpu.get("/v1/hosts").get("hosts") or []
        columns = ("Name", "Kind", "State", "Forgotten", "Last Seen (ms)")
        return columns, [(h.get("name"), h.get("kind"), h.get("state"), h.get("forgotten"),
                          h.get("last_seen_ms")) for h in hosts]


class _HostAction(command.ShowOne):
    action = ""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("host", metavar="<host>", help="The host's name")
        return parser

    def path(self, args):
        return "/v1/hosts/%s/%s" % (common.segment(args.host), self.action)

    def take_action(self, args):
        return host_row(self.app.client_manager.gpu.post(self.path(args)))


class DrainHost(_HostAction):
    """Drain a host: it takes no new cGPUs."""

    action = "drain"


class UndrainHost(_HostAction):
    """Let a drained host take cGPUs again."""

    action = "undrain"


class ForgetHost(_HostAction):
    """Forget a host that is gone (its agent silent; --force: even if alive)."""

    action = "forget"

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--force", action="store_true", help="Even if its agent is alive")
        return parser

    def path(self, args):
        return super().path(args) + ("?force=true" if args.force else "")


class EvacuateHost(_HostAction):
    """Move every cGPU off a host's GPUs."""

    action = "evacuate"

    def take_action(self, args):
        moved = self.app.client_manager.gpu.post(self.path(args))
        return ("moved", "vms"), (moved.get("moved"), ", ".join(moved.get("vms") or []))
