#!/usr/bin/env python3
"""Check a trace file written by ccq (tests/trace_json_golden.json): it parses, every async
begin (b) has one end (e) and every flow start (s) one finish (f), none earlier than its
start, and X slices of one track nest (check_trace_json.py's rule).

Usage: check_trace_golden.py FILE. Exit status 0 if all hold, 1 with the problems otherwise.
"""
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_trace_json  # noqa: E402


def main():
    with open(sys.argv[1]) as f:
        trace = json.load(f)  # raises on invalid JSON
    problems, marks = [], collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] in "bef" or e["ph"] == "s":
            pair = "be" if e["ph"] in "be" else "sf"
            marks[(pair, e.get("cat"), e["id"])].append((e["ph"], e["ts"]))
    for (pair, cat, eid), m in marks.items():
        if sorted(p for p, _ in m) != sorted(pair) or dict(m)[pair[1]] < dict(m)[pair[0]]:
            problems.append("%s %s: %s" % (cat, eid, m))
    check_trace_json.check_nesting(trace, problems)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
