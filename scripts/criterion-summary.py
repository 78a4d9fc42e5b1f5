#!/usr/bin/env python3
"""Prints criterion's results for the gpgpums placement bench as the table in BENCHMARKS.md.

Reads target/criterion/<group>/<policy>/<gpus>/new/estimates.json (mean, in ns) for the groups
`indexed` and `paper_sort_each_request`, and adds placements per second, the 100k/1k scaling and the
speed-up over the paper's baseline.
"""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")


def mean_ns(group, policy, gpus):
    path = root / group / policy.replace("+", "_") / str(gpus) / "new" / "estimates.json"
    if not path.exists():
        path = root / group / policy / str(gpus) / "new" / "estimates.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["mean"]["point_estimate"]


def fmt_time(ns):
    if ns is None:
        return "-"
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.2f} µs"
    return f"{ns / 1_000_000:.2f} ms"


policies = sorted(p.name for p in (root / "indexed").iterdir() if p.is_dir() and p.name != "report")
sizes = [1000, 10000, 100000]
print("| policy | 1k GPUs | 10k GPUs | 100k GPUs | placements/s at 100k | 100k/1k | paper sort at 100k | speed-up at 100k |")
print("|---|---|---|---|---|---|---|---|")
for policy in policies:
    t = [mean_ns("indexed", policy, n) for n in sizes]
    base = mean_ns("paper_sort_each_request", policy, 100000)
    rate = f"{1e9 / t[2]:,.0f}" if t[2] else "-"
    scale = f"{t[2] / t[0]:.2f}" if t[0] and t[2] else "-"
    speedup = f"{base / t[2]:,.0f}x" if base and t[2] else "-"
    name = policy.replace("_", "+")
    print(f"| {name} | {' | '.join(fmt_time(x) for x in t)} | {rate} | {scale} | {fmt_time(base)} | {speedup} |")
print()
print("| policy | paper sort 1k | paper sort 10k | paper sort 100k |")
print("|---|---|---|---|")
for policy in policies:
    base = [mean_ns("paper_sort_each_request", policy, n) for n in sizes]
    print(f"| {policy.replace('_', '+')} | {' | '.join(fmt_time(x) for x in base)} |")
if (root / "constrained").is_dir():
    print()
    print("Mixed fleet (8 models, 20 traits), requests cycling through 8 constraint sets:")
    print()
    print("| policy | 1k GPUs | 10k GPUs | 100k GPUs | placements/s at 100k | 100k/1k | unconstrained at 100k |")
    print("|---|---|---|---|---|---|---|")
    for policy in policies:
        t = [mean_ns("constrained", policy, n) for n in sizes]
        plain = mean_ns("indexed", policy, 100000)
        rate = f"{1e9 / t[2]:,.0f}" if t[2] else "-"
        scale = f"{t[2] / t[0]:.2f}" if t[0] and t[2] else "-"
        print(f"| {policy.replace('_', '+')} | {' | '.join(fmt_time(x) for x in t)} | {rate} | {scale} | {fmt_time(plain)} |")
