#!/usr/bin/env python3
"""Fails when a per-level kernel archive defines code shared with the rest of the program.

Each x86-64 level's GEMM kernels (tensor/cpu/gemm_kernel.cpp), GELU kernels
(tensor/cpu/gelu_kernel.cpp), attention's dropout and masked-softmax kernels
(tensor/cpu/dropout_kernel.cpp, tensor/cpu/masked_softmax_kernel.cpp) and layer norm rows
(tensor/cpu/norm_kernel.cpp), each built once per level, must define functions only in their
own namespaces, frugal::ops::cpu::<level> and frugal_eigen_<level> (Note [GEMM kernels per
instruction set] in tensor/cpu/gemm.cpp). A weak definition of any
other name (an inline function of std:: or of a frugal header compiled with AVX-512) would be
merged by the linker with the same function of the other objects, and the AVX-512 copy could
then run on a CPU without it.

    python3 tools/check_gemm_objects.py LIB_v2.a LIB_v3.a LIB_v4.a [...]  (names ..._vN.a)
"""
import re
import shutil
import subprocess
import sys


def level_of(path):
    m = re.search(r"_(v\d)\.a$", path)
    if not m:
        sys.exit(f"check_gemm_objects: cannot tell the level of {path} (expected a name ending in _vN.a)")
    return m.group(1)


def foreign_definitions(path, level):
    """The defined code and data symbols of `path` outside the level's own namespaces."""
    out = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    own = (f"frugal::ops::cpu::{level}::", f"frugal_eigen_{level}::")
    # DW.ref.__gxx_personality_v0 is the exception-handling personality's address (data, the
    # same in every object); .LC* are local constants.
    allowed = ("DW.ref.__gxx_personality_v0",)
    bad = []
    for line in out.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) != 3 or parts[1] in "rtbdn":  # local symbols cannot be merged
            continue
        name = parts[2]
        if any(o in name for o in own) or name in allowed:
            continue
        bad.append(f"{parts[1]} {name}")
    return bad


def main():
    if not shutil.which("nm"):
        print("check_gemm_objects: nm not found; skipped")
        return 77
    failures = 0
    for path in sys.argv[1:]:
        level = level_of(path)
        bad = foreign_definitions(path, level)
        print(f"{path}: {len(bad)} symbols outside frugal::ops::cpu::{level} and frugal_eigen_{level}")
        for b in bad[:20]:
            print("   ", b)
        failures += bool(bad)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
