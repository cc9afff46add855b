#!/usr/bin/env python3
"""Prints the slowest tests and test binaries of a nextest run from its JUnit report.

Usage: slowest.py JUNIT_XML... (COUNT=10 from the environment variable SLOWEST_COUNT)

The test command (scripts/test.sh) calls it after `cargo nextest run`, so that every run
ends with where its time went: the binaries whose tests took longest (summed; they run
side by side, so the sum is the binary's share of the machine, not its wall time) and the
single slowest tests.
"""
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: slowest.py JUNIT_XML...", file=sys.stderr)
        return 2
    count = int(os.environ.get("SLOWEST_COUNT", "10"))
    roots = []
    for path in sys.argv[1:]:
        try:
            roots.append(ET.parse(path).getroot())
        except (OSError, ET.ParseError) as e:
            print(f"slowest: cannot read the JUnit report {path}: {e}", file=sys.stderr)
            return 1
    tests = []
    failed = 0
    by_binary = defaultdict(float)
    for case in (case for root in roots for case in root.iter("testcase")):
        seconds = float(case.get("time", "0"))
        # nextest names a suite `<package>::<binary>`.
        binary = case.get("classname", "?")
        tests.append((seconds, binary, case.get("name", "?")))
        by_binary[binary] += seconds
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
    if not tests:
        print("slowest: the JUnit report lists no tests", file=sys.stderr)
        return 1
    total = sum(s for s, _, _ in tests)
    print(f"== slowest test binaries (test time summed; {len(tests)} tests, {total:.0f} s in all)")
    for binary, seconds in sorted(by_binary.items(), key=lambda kv: -kv[1])[:count]:
        print(f"{seconds:8.1f} s  {binary}")
    print(f"== slowest tests")
    for seconds, binary, name in sorted(tests, reverse=True)[:count]:
        print(f"{seconds:8.1f} s  {binary} {name}")
    print(f"tests: {len(tests) - failed} passed, {failed} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
