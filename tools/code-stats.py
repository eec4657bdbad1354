#!/usr/bin/env python3
"""Line counts per layer and the longest functions (issue 24's before/after report).

Usage: tools/code-stats.py [--top N]. Run from the repository root. A function is a brace block
opened by a line that holds a parameter list "(...)" and ends with "{" (namespaces, classes,
lambdas inside a function and control statements are not counted as functions of their own);
its length is its lines from the signature to the closing brace.
"""
import argparse
import os
import re
import sys

LAYERS = ["ops", "autograd", "nn", "optim", "models", "dist", "apps", "tools", "tests", "examples"]
SOURCE = (".h", ".cpp", ".cu", ".cuh")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|else|do|try)\b")
NOT_FUNCTION = re.compile(r"^\s*(namespace|class|struct|enum|union|extern)\b|=\s*\[|\[[^\]]*\]\s*\(")


def layer_dirs(root):
    """Each layer's folder: at the root, or one level down in tapestry/ (the older layout)."""
    out = {}
    for layer in LAYERS:
        for cand in (layer, os.path.join("tapestry", layer)):
            if os.path.isdir(os.path.join(root, cand)):
                out[layer] = cand
                break
    return out


def files_under(folder):
    for dirpath, _, names in os.walk(folder):
        for n in sorted(names):
            if n.endswith(SOURCE):
                yield os.path.join(dirpath, n)


def strip(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//")[0]


def functions(path):
    """(length, name, path, line) of each top-level function body in the file."""
    found = []
    depth = 0
    open_at = None  # (depth before the function's brace, start line, name)
    scope_stack = []  # depths that belong to namespaces/classes (functions may open inside them)
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    for i, raw in enumerate(lines):
        line = strip(raw)
        opens, closes = line.count("{"), line.count("}")
        if open_at is None and opens > closes and line.rstrip().endswith("{"):
            text = line
            j = i
            while "(" not in text and j > 0 and j > i - 3:  # a signature broken before the brace
                j -= 1
                text = strip(lines[j]) + text
            is_scope = NOT_FUNCTION.search(line) and not re.search(r"\)\s*(const)?\s*(override)?\s*\{", line)
            if "(" in text and not CONTROL.match(text) and not is_scope and (depth == 0 or depth in scope_stack):
                m = re.search(r"([A-Za-z_][\w:~]*)\s*\(", text)
                open_at = (depth, j + 1, m.group(1) if m else "?")
            elif depth == 0 or depth in scope_stack:
                scope_stack.append(depth + 1)
        depth += opens - closes
        while scope_stack and depth < scope_stack[-1]:
            scope_stack.pop()
        if open_at is not None and depth <= open_at[0]:
            found.append((i + 1 - open_at[1] + 1, open_at[2], path, open_at[1]))
            open_at = None
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    root = "."
    total = 0
    print("| layer | folder | files | lines |")
    print("|---|---|---|---|")
    all_funcs = []
    for layer, folder in layer_dirs(root).items():
        files = list(files_under(folder))
        if layer == "ops" or layer == "autograd":
            pass
        n = sum(sum(1 for _ in open(f, encoding="utf-8", errors="replace")) for f in files)
        total += n
        print(f"| {layer} | {folder} | {len(files)} | {n} |")
        for f in files:
            all_funcs.extend(functions(f))
    print(f"| all | | | {total} |")
    print()
    print(f"Longest functions (top {args.top}):")
    print()
    print("| lines | function | where |")
    print("|---|---|---|")
    for length, name, path, line in sorted(all_funcs, key=lambda x: -x[0])[: args.top]:
        print(f"| {length} | `{name}` | {os.path.normpath(path)}:{line} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
