#!/usr/bin/env python3
"""Sums doctest's test-case counts over the suites meson ran and prints the
closing line CI reads: "N passed, N failed". A test program that crashed or
timed out without a doctest summary counts as one failure."""
import json
import re
import sys

SUMMARY = re.compile(r"\[doctest\] test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed \|\s*(\d+) skipped")


def main(path: str) -> int:
    passed = failed = 0
    with open(path) as f:
        for line in f:
            test = json.loads(line)
            out = test.get("stdout", "") or ""
            found = SUMMARY.findall(out)
            if found:
                _, p, fl, _ = map(int, found[-1])
                passed += p
                failed += fl
            if test.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL") and not (found and int(found[-1][2]) > 0):
                failed += 1  # crashed, timed out, or failed outside doctest
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
