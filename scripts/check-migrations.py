#!/usr/bin/env python3
"""Checks the migrations against docs/upgrades.md's rule: expand now, contract a release later.

A migration after 0026 (when the rule was written) may only expand the schema, unless a line of
its own says `-- contract: <why>`: no DROP, RENAME, ALTER COLUMN, or new NOT NULL column without a
DEFAULT. Released migrations never change: their checksums are recorded in
migrations/released.sha256 (add a new migration's line when it is released with a commit).

    scripts/check-migrations.py [--self-test] [--record]
"""
import hashlib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "migrations"
RELEASED = MIGRATIONS / "released.sha256"
RULE_SINCE = 27

CONTRACTING = [
    (re.compile(r"\bDROP\s+(TABLE|COLUMN|INDEX|VIEW|TRIGGER|FUNCTION)\b", re.I), "drops"),
    (re.compile(r"\bRENAME\b", re.I), "renames"),
    (re.compile(r"\bALTER\s+COLUMN\b", re.I), "alters a column"),
    (re.compile(r"\bADD\s+COLUMN\b[^;]*\bNOT\s+NULL\b(?![^;]*\bDEFAULT\b)", re.I | re.S),
     "adds a NOT NULL column without a default"),
]


def strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def problems_of(name: str, sql: str) -> list:
    if re.search(r"^\s*--\s*contract:\s*\S", sql, re.M):
        return []
    body = strip_comments(sql)
    return [f"{name}: {what} (an expand-only migration; see docs/upgrades.md, or mark it "
            f"`-- contract: <why>`)" for pattern, what in CONTRACTING if pattern.search(body)]


def number(path: pathlib.Path) -> int:
    return int(path.name.split("_", 1)[0])


def check() -> list:
    problems = []
    for path in sorted(MIGRATIONS.glob("*.sql")):
        if number(path) >= RULE_SINCE:
            problems += problems_of(path.name, path.read_text())
    recorded = {}
    if RELEASED.exists():
        for line in RELEASED.read_text().splitlines():
            if line.strip():
                digest, name = line.split(None, 1)
                recorded[name.strip()] = digest
    for name, digest in recorded.items():
        path = MIGRATIONS / name
        if not path.exists():
            problems.append(f"{name}: a released migration is gone")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{name}: a released migration changed (write a new one instead)")
    return problems


def record() -> None:
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}"
             for p in sorted(MIGRATIONS.glob("*.sql"))]
    RELEASED.write_text("\n".join(lines) + "\n")


def self_test() -> None:
    fine = "CREATE TABLE t (a BIGINT);\nALTER TABLE v ADD COLUMN n BIGINT NOT NULL DEFAULT 0;\n"
    assert problems_of("x", fine) == [], problems_of("x", fine)
    for bad in ["ALTER TABLE v DROP COLUMN a;", "ALTER TABLE v RENAME TO w;",
                "ALTER TABLE v ALTER COLUMN a TYPE TEXT;", "ALTER TABLE v ADD COLUMN n BIGINT NOT NULL;",
                "DROP TABLE t;"]:
        assert problems_of("x", bad), bad
    assert problems_of("x", "-- contract: unused since 0.3\nDROP TABLE t;") == []
    assert problems_of("x", "-- we never DROP TABLE here\nCREATE TABLE t (a BIGINT);") == []
    print("check-migrations: self-test passed")


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        self_test()
        sys.exit(0)
    if "--record" in sys.argv:
        record()
        print(f"check-migrations: recorded {RELEASED.relative_to(ROOT)}")
        sys.exit(0)
    found = check()
    for p in found:
        print(f"check-migrations: {p}", file=sys.stderr)
    if found:
        sys.exit(1)
    print("check-migrations: every migration expands, none released changed")
