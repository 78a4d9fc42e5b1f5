#!/usr/bin/env python3
"""No import circle between a crate's modules, and no arrow up gsaasd's layers.

Reads every crate's `src/` and collects which modules each module names (`use crate::a::b`,
`use super::x`, `crate::a::b::f()` in code; grouped `use` lists included). A module may use its
own descendants and its ancestors' items (a child naming `super::App` is how Rust modules share
their parent's items); between any other two modules the arrows must not form a circle. In
gsaasd, the top-level modules also have layers, and an arrow may only point to a layer below
its own (or within it). Exits 1 and names each circle or upward arrow found.

Run: `python3 scripts/check-modules.py` (scripts/test.sh runs it, after `--self-test`).
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CRATES = ["gpgpums", "infra", "rodvr-contract", "rodvr-core", "rodvr-agent", "clouds", "datastore", "api", "cli", "openstack-config"]

# gsaasd's layers, highest first: a module may use modules of its own layer or below.
LAYERS = [
    {"main", "service"},
    {"http", "dashboard"},
    {"app", "auth"},
    # The configuration gathers its adapters' settings (`[cloud.nova]` is gsaas-clouds' `NovaConfig`).
    {"agents", "notifier", "db", "lanes", "cloudinit", "metrics", "config"},
    {"model", "error", "caller", "policy", "secret_url"},
]


def module_of(crate_src, path):
    rel = os.path.relpath(path, crate_src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main") and len(rel) > 1 or rel == ["lib"]:
        rel = rel[:-1]
    return tuple(rel)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def without_tests(text):
    """The text without its `#[cfg(test)] mod tests { ... }` block: unit tests may reach anywhere."""
    m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod tests\s*\{", text)
    if not m:
        return text
    depth, i = 1, m.end()
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[: m.start()] + text[i:]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = tree.strip()
    m = re.match(r"^(.*?)::\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        part = part.strip()
        if part:
            out += [prefix + "::" + p for p in expand_use(part)]
    return out


def targets(module, modules, text):
    """The modules `module`'s text names, resolved to the longest known module path."""
    found = set()
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths += expand_use(m.group(1))
    paths += re.findall(r"\b((?:crate|super)(?:::\w+)+)", text)
    for p in paths:
        p = re.sub(r"\s+as\s+\w+$", "", p.strip())
        segs = p.split("::")
        if segs[0] == "crate":
            base, segs = (), segs[1:]
        elif segs[0] == "super":
            base = module
            while segs and segs[0] == "super":
                base, segs = base[:-1], segs[1:]
        else:
            continue
        path = base
        best = base
        for s in segs:
            path = path + (s,)
            if path in modules:
                best = path
            else:
                break
        found.add(best)
    return found


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def layer(top):
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return None


def check(crate, root=ROOT, layered="api"):
    src = os.path.join(root, crate, "src")
    files = {}
    for dirpath, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                files[module_of(src, path)] = path
    modules = set(files)
    edges = {m: set() for m in modules}
    for m, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = strip_comments(f.read())
        text = without_tests(text)
        for t in targets(m, modules, text):
            if t != m and not related(m, t):
                edges[m].add(t)
    problems = []
    # Circles: Tarjan's strongly connected components.
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    for scc in sccs:
        names = ", ".join("::".join(m) or "(root)" for m in scc)
        arrows = [
            f"{'::'.join(a)} -> {'::'.join(b)}"
            for a in scc
            for b in sorted(edges[a])
            if b in scc
        ]
        problems.append(f"{crate}: import circle among {names}: " + "; ".join(arrows))
    if crate == layered:
        for a in sorted(modules):
            for b in sorted(edges[a]):
                la, lb = layer(a[0]) if a else None, layer(b[0]) if b else None
                if la is not None and lb is not None and lb < la:
                    problems.append(
                        f"{crate}: upward arrow {'::'.join(a)} -> {'::'.join(b)} "
                        f"(layer {la} uses layer {lb})"
                    )
    return problems


def self_test():
    """The check finds what it must: a circle, an upward arrow, and nothing in a clean tree."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:

        def crate(name, files):
            for path, text in files.items():
                full = os.path.join(root, name, "src", path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8") as f:
                    f.write(text)

        crate("circle", {"lib.rs": "mod a; mod b;", "a.rs": "use crate::b::B;", "b.rs": "use super::a::{A, AA};"})
        crate("up", {"lib.rs": "mod db; mod http;", "db.rs": "fn f() { crate::http::serve(); }", "http.rs": ""})
        crate("clean", {
            "lib.rs": "mod app;",
            "app/mod.rs": "mod x; mod y; pub struct App;",
            "app/x.rs": "use super::App; use super::y::Y;",
            "app/y.rs": "use super::App;\n#[cfg(test)]\npub(crate) mod tests { use super::super::x::X; }",
        })
        assert any("circle" in p for p in check("circle", root)), "a circle went unseen"
        assert any("upward" in p for p in check("up", root, layered="up")), "an upward arrow went unseen"
        assert check("clean", root) == [], check("clean", root)
    print("check-modules: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    problems = []
    for crate in CRATES:
        problems += check(crate)
    for p in problems:
        print(p)
    if problems:
        print(f"check-modules: {len(problems)} problem(s)", file=sys.stderr)
        sys.exit(1)
    print("check-modules: no import circle, no upward arrow")


if __name__ == "__main__":
    main()
