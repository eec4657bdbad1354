#!/usr/bin/env python3
"""The layer check: every #include "..." in the repository points down the layers, never up.

    ops <- autograd <- nn <- optim, models, dist <- apps (data <- eval <- train <- tasks) <- tools

tests/ and examples/ sit on top and may include any layer. Besides the order:
  - the engine (ops ... dist, tapestry.h) never includes the applications, tools or tests;
  - internals (ops/detail/, the backends ops/cpu/ and ops/cuda/) are included only by the engine's
    own source files and the tests, never by a public header, an application, a tool or an example
    (the installed package holds only the public headers: cmake/install.cmake);
  - the engine's headers are named as users name them, "tapestry/<layer>/...".
Usage: tools/check-layers.py (from anywhere; exits 1 and names each bad arrow).
"""
import os
import re
import subprocess
import sys

ENGINE_RANK = {"ops": 0, "autograd": 1, "nn": 2, "optim": 3, "models": 3, "dist": 3}
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


def main():
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
