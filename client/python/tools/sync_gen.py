#!/usr/bin/python3
"""Copies the generated stubs from gen/python into the package.

The package ships its own copy of the stubs under lockbroker/_gen, so that
`pip install ./client/python` needs nothing from the rest of the repository.
The copy is gen/python with its imports rewritten: `from lockbroker.v1
import x` becomes `from lockbroker._gen.lockbroker.v1 import x` (and the
same for buf.validate), so the generated top-level package `lockbroker`
does not clash with this one. Nothing else changes: the serialized
descriptors, and so the wire format, are byte for byte those of gen/python.

    /usr/bin/python3 client/python/tools/sync_gen.py          # write the copy
    /usr/bin/python3 client/python/tools/sync_gen.py --check  # exit 1 if stale

Run it after `buf generate` changes gen/python; the package's tests run
--check.
"""

import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)  # client/python
REPO = os.path.dirname(os.path.dirname(PKG_ROOT))
SRC = os.path.join(REPO, "gen", "python")
DST = os.path.join(PKG_ROOT, "lockbroker", "_gen")
PREFIX = "lockbroker._gen."

HEADER = "# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.\n"
# The generated packages, as Python module paths.
PACKAGES = ("lockbroker.v1", "buf.validate")
_IMPORT = re.compile(r"^(\s*)(from|import) (" + "|".join(re.escape(p) for p in PACKAGES) + r")\b", re.M)


def rewrite(text):
    """gen/python source → the package's copy."""
    return HEADER + _IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} {PREFIX}{m.group(3)}", text)


def expected():
    """{relative path: content} of the copy gen/python calls for."""
    if not os.path.isdir(SRC):
        raise SystemExit(f"sync_gen: {SRC} not found (run from a lockbroker checkout)")
    out = {"__init__.py": HEADER}
    for pkg in PACKAGES:
        parts = pkg.split(".")
        for i in range(1, len(parts) + 1):
            out[os.path.join(*parts[:i], "__init__.py")] = HEADER
        src_dir = os.path.join(SRC, *parts)
        for name in sorted(os.listdir(src_dir)):
            if not name.endswith((".py", ".pyi")):
                continue
            with open(os.path.join(src_dir, name), encoding="utf-8") as f:
                out[os.path.join(*parts, name)] = rewrite(f.read())
    return out


def actual():
    """{relative path: content} of the copy in the package now."""
    out = {}
    if not os.path.isdir(DST):
        return out
    for root, dirs, files in os.walk(DST):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith((".py", ".pyi")):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                out[os.path.relpath(path, DST)] = f.read()
    return out


def diff():
    """The relative paths that differ between the copy and gen/python."""
    want, have = expected(), actual()
    return sorted(p for p in set(want) | set(have) if want.get(p) != have.get(p))


def write():
    want, have = expected(), actual()
    for rel in set(have) - set(want):
        os.remove(os.path.join(DST, rel))
    for rel, text in want.items():
        if have.get(rel) == text:
            continue
        path = os.path.join(DST, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the copy differs from gen/python")
    args = ap.parse_args(argv)
    if args.check:
        stale = diff()
        if stale:
            print("client/python/lockbroker/_gen is out of sync with gen/python:", *stale, sep="\n  ", file=sys.stderr)
            print("run: /usr/bin/python3 client/python/tools/sync_gen.py", file=sys.stderr)
            return 1
        return 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
