"""`openstack gpu cohort list|show|set|remove|delete` (admins): projects that lend each other the
quota they do not use, and each member's terms.

gsaasd's `PUT /v1/cohorts/{name}` replaces a cohort's members: `set` and `remove` read the cohort,
change one member and put them all back, only if nobody changed the cohort meanwhile (`If-Match`
its version), reading and changing it again if someone did: one admin's change of a member never
undoes another's.
"""

from cliff import columns as cliff_columns
from osc_lib import exceptions
from osc_lib.cli import format_columns
from osc_lib.command import command

from gsaas_osc.v1 import common
from gsaas_osc.v1.quota import limit

# The resources a cohort lends, as the API names them and as the options do.
LENT = ("cgpus", "memory_mib", "exclusive_gpus")


def _amounts(amounts):
    """`cgpus/memory_mib/exclusive_gpus`, `-` where there is no limit."""
    amounts = amounts or {}
    return "/".join("-" if amounts.get(r) is None else str(amounts.get(r)) for r in LENT)


class MembersColumn(cliff_columns.FormattableColumn):
    """A cohort's members: as a table, a line per member (amounts as cGPUs/memory MiB/exclusive
    GPUs, `-` for no limit); as JSON or YAML, the members as gsaasd gives them."""

    def human_readable(self):
        lines = []
        for project in sorted(self._value or {}):
            member = self._value[project] or {}
            terms = member.get("terms") or {}
            line = "%s: borrowed %s, lendable %s; borrowing limit %s, lending limit %s; %s" % (
                project, _amounts(member.get("borrowed")), _amounts(member.get("lendable")),
                _amounts(terms.get("borrowing_limit")), _amounts(terms.get("lending_limit")),
                "borrows by default" if terms.get("borrow_by_default") else
                "borrows when asked")
            for model in sorted(terms.get("borrowing_limit_by_model") or {}):
                line += "; borrowing limit on %s %s" % (
                    model, _amounts(terms["borrowing_limit_by_model"][model]))
            lines.append(line)
        return "\n".join(lines)

    def machine_readable(self):
        return dict(self._value or {})


def cohort_row(cohort):
    """A cohort as (columns, values): its members and their terms, and what they borrow and
    could lend in all."""
    return ("name", "members", "borrowed", "lendable"), (
        cohort.get("name"),
        MembersColumn(cohort.get("members") or {}),
        format_columns.DictColumn(cohort.get("borrowed") or {}),
        format_columns.DictColumn(cohort.get("lendable") or {}),
    )


def cohort_path(name):
    return "/v1/cohorts/%s" % common.segment(name)


# How often a member's change is made again on a cohort another admin changed meanwhile.
TRIES = 5


def members_of(client, name):
    """The cohort's members and their terms (none when there is no such cohort yet), and the
    headers that change it only as read."""
    try:
        cohort = client.get(cohort_path(name))
    except exceptions.CommandError as e:
        if getattr(e, "http_status", None) == 404:
            return {}, {}
        raise
    members = {project: dict((member or {}).get("terms") or {})
               for project, member in (cohort.get("members") or {}).items()}
    version = cohort.get("version")
    return members, ({"If-Match": '"%s"' % version} if version else {})


def change_members(client, name, change):
    """Applies `change` to the cohort's members and writes them back (none left: ends it) only as
    read, again on a fresh read while another admin changed it: the cohort as written, or None
    when it ended."""
    for _ in range(TRIES):
        members, unchanged = members_of(client, name)
        change(members)
        try:
            if members:
                return client.put(cohort_path(name), {"members": members}, headers=unchanged)
            client.delete(cohort_path(name), headers=unchanged)
            return None
        except exceptions.CommandError as e:
            if getattr(e, "http_status", None) != 409 or getattr(e, "code", None) != "version_conflict":
                raise
    raise exceptions.CommandError(
        "cohort %s kept changing while it was read and written (%d tries): try again"
        % (name, TRIES))


class ListCohort(command.Lister):
    """List the cohorts: their members, what they borrow and what they could lend."""

    def take_action(self, args):
        cohorts = self.app.client_manager.gpu.get("/v1/cohorts").get("cohorts") or []
        columns = ("Name", "Members", "Borrowed", "Lendable")
        return columns, [
            (c.get("name"), format_columns.ListColumn(sorted(c.get("members") or {})),
             format_columns.DictColumn(c.get("borrowed") or {}),
             format_columns.DictColumn(c.get("lendable") or {}))
            for c in cohorts
        ]


class ShowCohort(command.ShowOne):
    """Show a cohort: each member's terms, what it borrows and what it could lend."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("name", metavar="<name>", help="The cohort's name")
        return parser

    def take_action(self, args):
        return cohort_row(self.app.client_manager.gpu.get(cohort_path(args.name)))


class SetCohort(command.ShowOne):
    """Put a project in a cohort (made if new), or change its terms there; the terms not given
    stay (a new member's: no limits, no borrowing by default). With --model, the --borrow-*
    limits are on what it holds on loan of that GPU model."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("name", metavar="<name>", help="The cohort's name")
        parser.add_argument("project", metavar="<project>", help="The project's id")
        parser.add_argument("--model", metavar="<model>",
                            help="The GPU model (exact name, as the pool shows it) the --borrow-* "
                                 "limits are on; a model left with no limit is dropped")
        for prefix, verb in (("borrow", "How much past its quota the project may borrow"),
                             ("lend", "How much of its unused quota the others may borrow")):
            for resource, what in (("cgpus", "cGPUs"), ("memory_mib", "GPU memory (MiB)"),
                                   ("exclusive_gpus", "exclusive GPUs")):
                parser.add_argument(
                    "--%s-%s" % (prefix, resource.replace("_", "-")),
                    dest="%s_%s" % (prefix, resource), type=limit, default=False,
                    metavar="<n|none>", help="%s: %s (none: no limit)" % (verb, what))
        default = parser.add_mutually_exclusive_group()
        default.add_argument("--borrow-by-default", dest="borrow_by_default",
                             action="store_true", default=None,
                             help="Its launches and attaches borrow when they do not say")
        default.add_argument("--no-borrow-by-default", dest="borrow_by_default",
                             action="store_false", default=None,
                             help="Its launches and attaches borrow only when they ask")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        borrow = {r: getattr(args, "borrow_%s" % r) for r in LENT
                  if getattr(args, "borrow_%s" % r) is not False}
        lend = {r: getattr(args, "lend_%s" % r) for r in LENT
                if getattr(args, "lend_%s" % r) is not False}
        if args.model is not None:
            if lend or args.borrow_by_default is not None:
                raise exceptions.CommandError(
                    "--lend-* and --borrow-by-default are not per model: give them without "
                    "--model")
            if not borrow:
                raise exceptions.CommandError(
                    "give at least one borrowing limit on the model: --borrow-cgpus, "
                    "--borrow-memory-mib or --borrow-exclusive-gpus")
        def change(members):
            terms = members.setdefault(args.project, {})
            if args.model is not None:
                by_model = dict(terms.get("borrowing_limit_by_model") or {})
                limits = dict(by_model.get(args.model) or {})
                limits.update(borrow)
                if all(limits.get(r) is None for r in LENT):
                    by_model.pop(args.model, None)
                else:
                    by_model[args.model] = limits
                terms["borrowing_limit_by_model"] = by_model
            else:
                terms["borrowing_limit"] = dict(terms.get("borrowing_limit") or {}, **borrow)
                terms["lending_limit"] = dict(terms.get("lending_limit") or {}, **lend)
                if args.borrow_by_default is not None:
                    terms["borrow_by_default"] = args.borrow_by_default

        return cohort_row(change_members(client, args.name, change))


class RemoveCohort(command.Command):
    """Take a project out of a cohort (its last member out ends the cohort)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("name", metavar="<name>", help="The cohort's name")
        parser.add_argument("project", metavar="<project>", help="The project's id")
        return parser

    def take_action(self, args):
        client = self.app.client_manager.gpu
        def change(members):
            if members.pop(args.project, None) is None:
                raise exceptions.CommandError(
                    "project %s is not in cohort %s" % (args.project, args.name))

        change_members(client, args.name, change)


class DeleteCohort(command.Command):
    """End a cohort: its members keep their own quotas; what they borrowed stays held."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("name", metavar="<name>", help="The cohort's name")
        return parser

    def take_action(self, args):
        self.app.client_manager.gpu.delete(cohort_path(args.name))
