#!/usr/bin/env python3
"""Checks that the differentiable op table (tests/op_table/grad_table.h) has an entry for
every differentiable op: each function declared in autograd/ops/*.h and each Tensor view or
copy method that autograd records (tensor/tensor.h), so that a new op without an entry fails
the cpu suite. Also fails on an entry that names no declared op, or on a stale exemption.

    python3 tools/check_grad_table.py ROOT OP_FUZZ    (OP_FUZZ: build/tests/op_fuzz, for --grad --list)
"""
import pathlib
import re
import subprocess
import sys

# Declared but not differentiable: forwarded to the raw ops (bool or index results), or helpers.
NOT_DIFFERENTIABLE = {
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",  # binary.h
    "argmax", "argmin",  # reduce.h
    "argsort",  # sort.h
    "one_hot",  # index.h
    "isnan", "isinf", "isfinite",  # unary.h
    "nonzero",  # masked.h
    "any", "all", "count_nonzero",  # statistics.h
    "alias_for_history",  # inplace.h: a transform's handle on its output, not an op
    "running_stat_to_update",  # batch_norm.h: which running statistic an op updates, not an op
    "unary_op",  # unary_op.h: the recording helper behind unary.h and activation.h (their entries cover it)
    "unary_grad_graph",  # unary_op.h: unary backward formulas under create_graph, run by every unary entry's gradgradcheck
}
# Tensor methods that are other methods' spellings, or not recorded.
METHODS_EXEMPT = {
    "cpu": "to(kCPU)",
    "expand_as": "expand(other.sizes())",
    "as_strided": "not differentiable in frugal: it throws when the input requires grad",
}

# A free function of namespace frugal: `Tensor add(`, `const Tensor& add_(`, `std::vector<Tensor> split(`.
FUNCTION = re.compile(r"^(?:const Tensor&|Tensor|std::vector<Tensor>|ValuesIndices)\s+(\w+)\(", re.M)
METHOD = re.compile(r"^\s+(?:const Tensor&|Tensor)\s+(\w+)\(", re.M)


def declared_functions(root: pathlib.Path) -> dict:
    found = {}
    for header in sorted((root / "autograd" / "ops").glob("*.h")):
        text = header.read_text()
        for m in FUNCTION.finditer(text):
            found.setdefault(m.group(1), header.relative_to(root).as_posix())
    return found


def recorded_methods(root: pathlib.Path) -> set:
    text = (root / "tensor" / "tensor.h").read_text()
    start, end = text.index("// ---- views"), text.index("// ---- autograd")
    return set(METHOD.findall(text[start:end]))


def main(argv) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    root, op_fuzz = pathlib.Path(argv[1]), argv[2]
    names = subprocess.run([op_fuzz, "--grad", "--list"], check=True, capture_output=True, text=True).stdout.split("\n")
    names = [n for n in names if n]
    problems = []
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"entries named twice: {', '.join(dupes)}")
    covered = {n.split("(")[0].strip() for n in names}
    functions = declared_functions(root)
    methods = recorded_methods(root)
    for name, header in sorted(functions.items()):
        if name not in covered and name not in NOT_DIFFERENTIABLE:
            problems.append(f"{header}: {name} has no entry in the differentiable op table (tests/op_table/grad_ops_*.cpp)")
    for name in sorted(methods):
        if f"Tensor::{name}" not in covered and name not in METHODS_EXEMPT:
            problems.append(f"tensor/tensor.h: Tensor::{name} has no entry in the differentiable op table")
    for name in sorted(NOT_DIFFERENTIABLE - set(functions)):
        problems.append(f"check_grad_table.py: exempts {name}, which autograd/ops/*.h no longer declares")
    for name in sorted(set(METHODS_EXEMPT) - methods):
        problems.append(f"check_grad_table.py: exempts Tensor::{name}, which tensor/tensor.h no longer declares")
    for name in sorted(covered):
        base = name[len("Tensor::"):] if name.startswith("Tensor::") else name
        if (base not in methods) if name.startswith("Tensor::") else (base not in functions):
            problems.append(f"the entry {name} names no op declared in autograd/ops/*.h or tensor/tensor.h")
    if problems:
        print(f"check_grad_table: {len(problems)} problems\n")
        for p in problems:
            print(f"  {p}")
        return 1
    print(f"check_grad_table: {len(names)} entries cover the {len(functions) - len(NOT_DIFFERENTIABLE)} "
          f"differentiable functions of autograd/ops/*.h and {len(methods) - len(METHODS_EXEMPT)} Tensor methods")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
