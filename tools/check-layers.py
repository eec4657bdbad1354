#!/usr/bin/env python3
"""The layer check: every #include "..." in the repository points down the layers, never up.

    ops <- autograd <- nn, data <- optim, models, dist <- apps (data <- eval <- train <- tasks) <- tools

tests/ and examples/ sit on top and may include any layer. Besides the order:
  - the engine (ops ... dist, tapestry.h) never includes the applications, tools or tests;
  - internals (ops/detail/, the backends ops/cpu/ and ops/cuda/) are included only by the engine's
    own source files and the tests, never by a public header, an application, a tool or an example
    (the installed package holds only the public headers: cmake/install.cmake);
  - the engine's headers are named as users name them, "tapestry/<layer>/...".
With --objects DIR... it checks the built engine the same way, one level lower: no object file of a
layer needs a symbol that only a higher (or sibling) layer defines, so ops/ links without autograd
(Note [Sealed core] in ops/tensor.h), autograd without nn, and so on. Each DIR is a CMake target's
object folder (build/CMakeFiles/tapestry.dir, ...), whose subfolders are named by layer.
Usage: tools/check-layers.py [--objects DIR...] (from anywhere; exits 1 and names each bad arrow).
"""
import os
import re
import subprocess
import sys

ENGINE_RANK = {"ops": 0, "autograd": 1, "nn": 2, "data": 2, "optim": 3, "models": 3, "dist": 3}
APPS_RANK = {"data": 0, "eval": 1, "train": 2, "tasks": 3}
INTERNAL = re.compile(r"^ops/(detail|cpu|cuda)/")
SOURCE = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def where(path):
    """(layer, sublayer) of a repository path, or None for files outside the layers."""
    parts = path.split("/")
    if path == "tapestry.h":
        return ("api", None)
    if parts[0] in ENGINE_RANK:
        return ("engine", parts[0])
    if parts[0] == "apps" and len(parts) > 2:
        return ("apps", parts[1])
    if parts[0] in ("tools", "tests", "examples"):
        return (parts[0], None)
    return None


def target(include):
    """The repository path an include names: "tapestry/ops/x.h" -> "ops/x.h"."""
    if include == "tapestry/tapestry.h":
        return "tapestry.h"
    if include == "tapestry/version.h":
        return None  # generated
    if include.startswith("tapestry/"):
        return include[len("tapestry/"):]
    return include


def check(path, include):
    """An error message for one arrow, or None."""
    src = where(path)
    dst_path = target(include)
    if src is None or dst_path is None:
        return None
    if src[0] == "engine" and not include.startswith("tapestry/") and "/" in include:
        return f'names an engine header by its folder ("{include}"); write "tapestry/{include}"'
    dst = where(dst_path)
    if dst is None:
        return None  # a system or third-party header in quotes
    if dst[0] == "engine" and not include.startswith("tapestry/"):
        return f'names an engine header by its folder ("{include}"); write "tapestry/{dst_path}"'
    layer, sub = src
    internal = bool(INTERNAL.match(dst_path))
    if internal:
        own_source = layer == "engine" and (not path.endswith(".h") or INTERNAL.match(path))
        if not (own_source or layer == "tests"):
            return f"includes the internal {dst_path} (internals are for the engine's own sources and tests)"
    if layer in ("tests", "examples"):
        return None
    if layer in ("engine", "api"):
        if dst[0] not in ("engine", "api"):
            return f"the engine includes {dst_path} ({dst[0]} sits above the engine)"
        if layer == "api":
            return None
        if dst[0] == "api":
            return "the engine includes the umbrella tapestry.h (include what you use)"
        if dst[1] != sub and ENGINE_RANK[dst[1]] >= ENGINE_RANK[sub]:
            return f"{sub} includes {dst_path}: {dst[1]} does not sit below {sub}"
        return None
    if layer == "apps":
        if dst[0] in ("tools", "tests", "examples"):
            return f"an application includes {dst_path} ({dst[0]} sits above the applications)"
        if dst[0] == "apps" and dst[1] != sub and APPS_RANK[dst[1]] >= APPS_RANK[sub]:
            return f"apps/{sub} includes {dst_path}: apps/{dst[1]} does not sit below apps/{sub}"
        return None
    if layer == "tools" and dst[0] in ("tests", "examples"):
        return f"a tool includes {dst_path} ({dst[0]} sits above the tools)"
    return None


def nm_symbols(obj):
    """(defined, undefined) global symbols of one object file, mangled."""
    out = subprocess.check_output(["nm", "-P", "-g", obj], text=True)
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        (undefined if fields[1] in ("U", "w", "v") else defined).add(fields[0])
    return defined, undefined


def demangle(names):
    try:
        return subprocess.check_output(["c++filt"], input="\n".join(names), text=True).splitlines()
    except OSError:
        return list(names)


def check_objects(dirs):
    """Every engine object file's needs are met by its own layer or a lower one."""
    defined = {}    # layer -> symbols its objects define
    needs = []      # (layer, object, undefined symbols)
    for top in dirs:
        for layer in ENGINE_RANK:
            folder = os.path.join(top, layer)
            for dirpath, _, names in os.walk(folder):
                for name in sorted(names):
                    if not name.endswith(".o"):
                        continue
                    obj = os.path.join(dirpath, name)
                    d, u = nm_symbols(obj)
                    defined.setdefault(layer, set()).update(d)
                    needs.append((layer, os.path.relpath(obj, top), u))
    if not needs:
        print(f"check-layers --objects: no object files under {' '.join(dirs)} (build first)")
        return 1
    bad = 0
    for layer, obj, undefined in needs:
        below = set().union(*(defined.get(l, set()) for l in ENGINE_RANK
                              if ENGINE_RANK[l] < ENGINE_RANK[layer] or l == layer))
        for sym in sorted(undefined - below):
            owners = [l for l in ENGINE_RANK if sym in defined.get(l, set())]
            if owners:
                print(f"{obj}: needs {demangle([sym])[0]}, defined in {', '.join(owners)}, "
                      f"which does not sit below {layer}")
                bad += 1
    if bad:
        print(f"check-layers --objects: {bad} symbol(s) needed up the layers (the order: tools/check-layers.py)")
        return 1
    print(f"check-layers --objects: {len(needs)} object files, every symbol they need comes from their layer or below")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--objects":
        return check_objects(sys.argv[2:])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = subprocess.check_output(["git", "-C", root, "ls-files"], text=True).split("\n")
    bad = 0
    for path in files:
        if not path.endswith(SOURCE) or where(path) is None:
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m:
                    err = check(path, m.group(1))
                    if err:
                        print(f"{path}:{n}: {err}")
                        bad += 1
    if bad:
        print(f"check-layers: {bad} include(s) run the wrong way (the order: tools/check-layers.py)")
        return 1
    print("check-layers: every include runs down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
