#!/usr/bin/env python3
"""docs/architecture.md is true: every name it gives in backticks exists, and its layers are the
ones scripts/check-modules.py enforces.

A page that says where things live goes stale quietly: a file moves, a type is renamed, a rule is
dropped, and the page still reads well. This reads every `code span` of the page and checks:

- a path (`app/pool.rs`, `pool/`, `migrations/0028_notifications.*.sql`) names a tracked file or
  folder: some tracked path ends with it (a `*` matches within one name);
- a Rust path (`App::pool_tx`, `db::begin_pool_write`, `Booking::Reserve`) names items that are
  defined: each CamelCase segment as a struct, enum, trait, type or enum variant, each
  UPPER_CASE one as a const or static, the last snake_case segment as a fn, const, static,
  module or field;
- a lone CamelCase name (`PoolTx`) is a defined type, trait or variant;
- a snake_case name with an underscore (`insert_vms_with_cgpus`, `cgpus_version`) is defined as
  a fn, field, module, const, column or saga step somewhere in the sources;
- the numbered list of gsaasd's layers equals `LAYERS` of scripts/check-modules.py.

Spans with spaces (commands, config lines), plain words and the names of files built or read at
run time (`libcuda.so.1`, `clouds.yaml`) are not names of the repository's and are skipped.
Exits 1 and lists what the page names that does not exist.

Run: `python3 scripts/check-architecture.py` (scripts/test.sh runs it, after `--self-test`).
"""
import fnmatch
import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PAGE = "docs/architecture.md"
SOURCE_SUFFIXES = (".rs", ".sql", ".py", ".sh", ".c", ".h", ".toml", ".js", ".html", ".yaml")


def tracked(root):
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout
    return [p for p in out.splitlines() if os.path.exists(os.path.join(root, p))]


class Sources:
    """What the sources define, read once."""

    def __init__(self, root, files):
        self.files = files
        self.folders = set()
        for f in files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.folders.add("/".join(parts[:i]) + "/")
        self.types, self.items, self.words = set(), set(), set()
        for f in files:
            # Not this script: its self-test names things that must not exist.
            if not f.endswith(SOURCE_SUFFIXES) or f == "scripts/check-architecture.py":
                continue
            try:
                text = open(os.path.join(root, f), encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            self.words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
            if not f.endswith(".rs"):
                continue
            self.types.update(re.findall(r"\b(?:struct|enum|trait|type|union)\s+([A-Z]\w*)", text))
            # Enum variants and other CamelCase items: a capitalised name that starts a line in a
            # body (`    Reserve {`, `    Reserve(..),`, `    Reserve,`).
            self.types.update(re.findall(r"^\s+([A-Z]\w*)\s*(?:[,({=]|$)", text, re.M))
            self.items.update(re.findall(r"\b(?:fn|const|static|mod)\s+([A-Za-z_]\w*)", text))
            # Fields: `name: Type` at the start of a line.
            self.items.update(re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?([a-z_]\w*)\s*:", text, re.M))
            self.items.update(re.findall(r"macro_rules!\s*(\w+)", text))
        self.items.update(os.path.splitext(os.path.basename(f))[0] for f in files if f.endswith(".rs"))

    def path_exists(self, name):
        if "*" in name:
            return any(fnmatch.fnmatch(f, "*" + name) or fnmatch.fnmatch(f, name) for f in self.files)
        if name.endswith("/"):
            return name in self.folders or any(d.endswith("/" + name) for d in self.folders)
        return name in self.files or any(f.endswith("/" + name) for f in self.files) or (
            name + "/" in self.folders or any(d.endswith("/" + name + "/") for d in self.folders))


PATHLIKE = re.compile(r"^[\w.*-]+(/[\w.*-]*)+$|^[\w*-]+\.(rs|py|sh|sql|md|json|toml|c|h|html|js)$")
RUST_PATH = re.compile(r"^[A-Za-z_]\w*(::[A-Za-z_]\w*)+(\(\))?$")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+[A-Z]\w*$|^[A-Z][a-z0-9]+$")
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+(\(\))?$")


def problems_in(text, sources):
    found = []
    for span in sorted(set(re.findall(r"`([^`\n]+)`", text))):
        name = span.strip()
        if " " in name or not name:
            continue
        if PATHLIKE.match(name) and not name.startswith("::"):
            if not sources.path_exists(name.rstrip(":")):
                found.append(f"{name}: no such file or folder")
        elif RUST_PATH.match(name):
            segments = name.removesuffix("()").split("::")
            for i, seg in enumerate(segments):
                if seg in ("crate", "self", "super") or seg in ("std",):
                    continue
                last = i == len(segments) - 1
                if seg.isupper():
                    if seg not in sources.items:
                        found.append(f"{name}: no const or static {seg}")
                elif seg[0].isupper():
                    if seg not in sources.types:
                        found.append(f"{name}: no type or variant {seg}")
                elif last and seg not in sources.items:
                    found.append(f"{name}: no fn, const, module or field {seg}")
                elif not last and seg not in sources.items and seg not in sources.words:
                    found.append(f"{name}: no module {seg}")
        elif CAMEL.match(name):
            if name not in sources.types:
                found.append(f"{name}: no such type, trait or variant")
        elif SNAKE.match(name):
            if name.removesuffix("()") not in sources.words:
                found.append(f"{name}: named nowhere in the sources")
    return found


def layers_in(text):
    """The numbered list under 'no arrow up these layers': one set of module names per item."""
    block = text.split("no arrow up these layers", 1)
    if len(block) < 2:
        return None
    layers = []
    for line in block[1].splitlines()[1:]:
        m = re.match(r"^(\d+)\. (.*)$", line)
        if m:
            layers.append(line)
        elif layers and line.startswith("   "):
            layers[-1] += " " + line.strip()
        elif layers and not line.strip():
            break
    # Names are the code spans before any parenthesis of an item.
    return [set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", item))) for item in layers]


def enforced_layers(root):
    spec = importlib.util.spec_from_file_location("check_modules", os.path.join(root, "scripts/check-modules.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


def check(root=ROOT):
    text = open(os.path.join(root, PAGE), encoding="utf-8").read()
    sources = Sources(root, tracked(root))
    found = problems_in(text, sources)
    listed = layers_in(text)
    if listed != enforced_layers(root):
        found.append(f"the page's layers {listed} are not scripts/check-modules.py's LAYERS")
    return found


def self_test():
    here = ROOT
    sources = Sources(here, tracked(here))
    page = (
        "`app/pool.rs` `gpgpums/src/pool/` `migrations/0028_notifications.*.sql` `App::pool_tx` "
        "`Booking::Reserve` `PoolTx` `insert_vms_with_cgpus` `cargo run -q` `ready`"
    )
    assert problems_in(page, sources) == [], problems_in(page, sources)
    assert problems_in("`SagaStep::LAUNCH`", sources) == []
    for stale in ["`app/nowhere.rs`", "`App::no_such_method`", "`SagaStep::NO_SUCH_CONST`", "`NoSuchType`", "`never_named_anywhere_xyz`",
                  "`Nowhere::pool_tx`", "`pool/gone/`"]:
        assert problems_in(stale, sources), f"{stale} went unseen"
    layers = layers_in("no arrow up these layers, highest first:\n\n1. `a`, `b` (x `c`)\n2. `d`\n   `e`\n\nafter")
    assert layers == [{"a", "b"}, {"d", "e"}], layers
    print("check-architecture self-test: ok")


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        self_test()
        sys.exit(0)
    problems = check()
    for p in problems:
        print(f"{PAGE}: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)
