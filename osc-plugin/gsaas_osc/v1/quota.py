"""`openstack gpu quota show|set`: a project's cGPU limits and use, its cohort and what it
borrows from it."""

from osc_lib.cli import format_columns
from osc_lib.command import command

from gsaas_osc.v1 import common

LIMITS = ("cgpus", "memory_mib", "exclusive_gpus", "vms")


def quota_row(quota):
    limits = quota.get("limits") or {}
    usage = quota.get("usage") or {}
    columns = ["project", "own_limits"]
    values = [quota.get("project"), quota.get("own_limits")]
    for name in LIMITS:
        columns += [name, "%s_used" % name]
        values += [limits.get(name), usage.get(name)]
    columns.append("max_priority")
    values.append(limits.get("max_priority"))
    # The cohort it is in (none: nothing to borrow), and what it holds past its limits on loan.
    columns += ["cohort", "borrowed"]
    values += [quota.get("cohort"), format_columns.DictColumn(quota.get("borrowed") or {})]
    return tuple(columns), tuple(values)


class ShowQuota(command.ShowOne):
    """Show a project's cGPU quota and use (default: your project's)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("project", metavar="<project>", nargs="?",
                            help="The project's id (default: the token's project)")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        project = args.project or self.app.client_manager.auth_ref.project_id
        return quota_row(client.get("/v1/quotas/%s" % common.segment(project)))


def limit(text):
    """A limit as given: a number, or `none` for no limit."""
    if text.lower() in ("none", "unlimited", "-1"):
        return None
    value = int(text)
    if value < 0:
        raise ValueError("a limit is a number of at least 0, or none")
    return value


class SetQuota(command.ShowOne):
    """Set a project's cGPU limits (admins); the limits not given stay."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("project", metavar="<project>", help="The project's id")
        for name in LIMITS:
            parser.add_argument("--%s" % name.replace("_", "-"), type=limit, default=False,
                                metavar="<n|none>", help="Limit on %s" % name.replace("_", " "))
        parser.add_argument("--max-priority", type=int,
                            help="The highest priority the project's launches may ask for")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        path = "/v1/quotas/%s" % common.segment(args.project)
        limits = dict(client.get(path).get("limits") or {})
        given = {name: getattr(args, name) for name in LIMITS if getattr(args, name) is not False}
        if not given and args.max_priority is None:
            from osc_lib import exceptions
            raise exceptions.CommandError(
                "give at least one limit: --cgpus, --memory-mib, --exclusive-gpus, --vms or "
                "--max-priority")
        limits.update(given)
        if args.max_priority is not None:
            limits["max_priority"] = args.max_priority
        return quota_row(client.put(path, limits))
