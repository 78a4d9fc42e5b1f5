"""What the commands share: paths, waiting for a VM to settle, borrowing past the quota, and a
VM as OSC shows it."""

import time
import urllib.parse

from osc_lib import exceptions
from osc_lib.cli import format_columns

# How long --wait follows a VM, at most.
WAIT_LIMIT_SECS = 900


def segment(value):
    """`value` as one path segment."""
    return urllib.parse.quote(str(value), safe="")


def vm_path(vm_id):
    return "/v1/vms/%s" % segment(vm_id)


def wait_for(client, vm_id, done):
    """Follows the VM (long polls) until `done(vm)` or it ends in error; returns it."""
    deadline = time.monotonic() + WAIT_LIMIT_SECS
    while True:
        vm = client.get(vm_path(vm_id) + "?wait=30")
        if done(vm):
            return vm
        if vm.get("state") == "error":
            raise exceptions.CommandError(
                "VM %s ended in error: %s" % (vm_id, vm.get("error") or "no reason given")
            )
        if time.monotonic() > deadline:
            raise exceptions.CommandError("VM %s still %s after %d s" % (
                vm_id, vm.get("state"), WAIT_LIMIT_SECS))


def settled(vm):
    """Ready with no cGPU attaching or detaching, or deleted."""
    if vm.get("state") == "deleted":
        return True
    cgpus = vm.get("cgpus") or []
    return vm.get("state") == "ready" and all(c.get("state") == "live" for c in cgpus)


def add_borrow_options(parser):
    """`--borrow` / `--no-borrow` of a launch or an attach; neither: the project's default."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--borrow", dest="borrow", action="store_true", default=None,
                       help="Past your project's quota, run on what its cohort's other projects "
                            "leave unused (those cGPUs are marked borrowed and may be taken "
                            "back); default: your project's setting in its cohort")
    group.add_argument("--no-borrow", dest="borrow", action="store_false", default=None,
                       help="Never borrow past your project's quota, whatever its setting")


def borrow_into(body, args):
    """Adds `borrow` to a request when `--borrow` or `--no-borrow` was given (absent: gsaasd
    applies the project's default in its cohort)."""
    if args.borrow is not None:
        body["borrow"] = args.borrow
    return body


def borrowed_indexes(vm):
    """The indexes of the VM's cGPUs on loan from its project's cohort."""
    return [c.get("index") for c in vm.get("cgpus") or [] if c.get("borrowed")]


VM_COLUMNS = (
    "id", "name", "state", "project", "image", "flavor", "ncgpus", "mode", "gpu_memory_mib",
    "locality", "cgpus", "borrowed", "fixed_ip", "server_id", "queue_position", "error",
)


def vm_row(vm):
    """The VM as (columns, values): its request, each cGPU as `index state masked-endpoint`
    (where the GPU really is stays hidden, as in every view a tenant gets; `borrowed` after one on
    loan), and `borrowed`: the indexes of the cGPUs on loan from the project's cohort."""
    gpus = vm.get("gpus") or {}
    cgpus = ", ".join(
        "#%s %s %s%s" % (c.get("index"), c.get("state"), c.get("masked_endpoint"),
                         " borrowed" if c.get("borrowed") else "")
        for c in vm.get("cgpus") or []
    )
    values = {
        "ncgpus": gpus.get("ncgpus"),
        "mode": gpus.get("mode"),
        "gpu_memory_mib": gpus.get("gpu_memory_mib"),
        "locality": gpus.get("locality"),
        "cgpus": cgpus,
        "borrowed": format_columns.ListColumn(borrowed_indexes(vm)),
    }
    return VM_COLUMNS, tuple(values[c] if c in values else vm.get(c) for c in VM_COLUMNS)
