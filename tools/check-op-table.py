#!/usr/bin/env python3
"""The op table covers every op: each function declared in autograd/functions.h is called by a row
of the OpInfo table (tests/opinfo.cpp, its add_*_rows families), and each elementwise kernel kind (Unary and
Binary in ops/detail/kernels.h) is reached by a row. The table's rows give the forward values
against PyTorch, the gradcheck, error parity and the device runs, so an op without a row is an
untested op. A few ops cannot be rows (random draws); they are listed below with the tests that
cover them instead.

Usage: tools/check-op-table.py (exits 1 naming what has no row; ctest `check_op_table`).
"""
import os
import re
import sys

# Functions that are not rows of the table, and why (with where they are tested).
NOT_ROWS = {
    "dropout": "random: its mask and scale are checked in tests/test_ops.cpp, its gradient in test_gradcheck.cpp",
    "multinomial": "random and not differentiable: tests/test_sort_ops.cpp checks its draws",
}
# Kernel kinds reached through a row of another name: backward kinds through their op's gradcheck.
KIND_ROWS = {
    "Unary::Sign": "abs",             # abs's backward
    "Unary::GeluTanh": "gelu_tanh",
    "Unary::PowScalar": "pow_2",
    "Binary::ReluBackward": "relu",
    "Binary::GeluBackward": "gelu",
    "Binary::GeluTanhBackward": "gelu_tanh",
}


def snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    read = lambda p: open(os.path.join(root, p), encoding="utf-8").read()
    header = re.sub(r"//.*", "", read("autograd/functions.h"))
    functions = sorted(set(re.findall(r"^\s*(?:Tensor|TensorList|ValuesIndices)\s+(\w+)\s*\(", header, re.M)))
    table_src = read("tests/opinfo.cpp")
    table = table_src[table_src.index("struct Entry {"):]  # the add_*_rows families and build_table
    rows = set(re.findall(r'entry\("([^"]+)"', table))
    kinds_src = read("ops/detail/kernels.h")
    kinds = []
    for enum in ("Unary", "Binary"):
        body = re.search(r"enum class " + enum + r"\s*\{([^}]*)\}", kinds_src).group(1)
        kinds += [f"{enum}::{k.strip()}" for k in body.split(",") if k.strip()]

    bad = []
    for f in functions:
        if f in NOT_ROWS:
            continue
        if not re.search(r"\b" + f + r"\s*\(", table):
            bad.append(f"autograd/functions.h declares {f}, and no OpInfo row calls it")
    for kind in kinds:
        row = KIND_ROWS.get(kind, snake(kind.split("::")[1]))
        if row not in rows:
            bad.append(f"the kernel kind {kind} has no OpInfo row (expected a row '{row}', or an entry in "
                       f"KIND_ROWS of tools/check-op-table.py naming the row that reaches it)")
    for f in NOT_ROWS:
        if f not in functions:
            bad.append(f"NOT_ROWS names {f}, which autograd/functions.h no longer declares")
    for line in bad:
        print("check-op-table:", line)
    if bad:
        return 1
    print(f"check-op-table: {len(functions) - len(NOT_ROWS)} functions and {len(kinds)} kernel kinds, each "
          f"reached by a row of the {len(rows)}-row OpInfo table ({len(NOT_ROWS)} random ops tested apart)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
