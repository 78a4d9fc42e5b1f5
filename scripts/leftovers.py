#!/usr/bin/env python3
"""What a test command left running: the processes whose environment carries
LEFTOVER_CHECK_RUN=<this run's marker> (scripts/test.sh exports it at its start, and every process the
run starts inherits it), other than this script and its ancestors.

    scripts/leftovers.py MARKER          lists them and ends them (TERM, then KILL); exit 1 if any
    scripts/leftovers.py --self-test     proves it finds a process left behind, and only that

A process started with an emptied environment (env -i) carries no marker and is not seen: the
tests' helpers that start servers keep the environment.
"""
import os
import signal
import subprocess
import sys
import time

VARIABLE = b"LEFTOVER_CHECK_RUN="


def ancestors():
    """This process and every process above it."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            pid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def carrying(marker):
    """(pid, command line) of every process whose environment holds the marker."""
    wanted = VARIABLE + marker.encode()
    found, mine = [], ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            if wanted not in environ:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        found.append((int(entry), command or "?"))
    return sorted(found)


def end(pids):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.1)


def check(marker):
    left = carrying(marker)
    if not left:
        return 0
    print(f"leftovers: the test run left {len(left)} process(es) running:", file=sys.stderr)
    for pid, command in left:
        print(f"  {pid}  {command[:200]}", file=sys.stderr)
    end([pid for pid, _ in left])
    return 1


def self_test():
    marker = f"self-test-{os.getpid()}"
    env = dict(os.environ, LEFTOVER_CHECK_RUN=marker)
    # A process whose parent exits at once: the orphan an `&` left behind.
    subprocess.run(["sh", "-c", "sleep 60 & exit 0"], env=env, check=True)
    other = subprocess.Popen(["sleep", "60"], env=dict(os.environ, LEFTOVER_CHECK_RUN="another-run"))
    try:
        left = carrying(marker)
        assert [c for _, c in left] == ["sleep 60"], left
        assert check(marker) == 1
        assert carrying(marker) == [], "ended"
        assert other.poll() is None, "another run's process was ended"
        assert check(marker) == 0
    finally:
        other.kill()
        other.wait()
    print("leftovers: self-test passed")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2 or not sys.argv[1]:
        sys.exit("usage: scripts/leftovers.py MARKER | --self-test")
    sys.exit(check(sys.argv[1]))
