#!/usr/bin/env python3
"""Calls into matching functions per request, by calling function, from one callgrind dump.

    python3 bench/callgrind_calls.py target/instructions/callgrind.out.2 \\
        '__rust_alloc$|__rust_realloc$|__rust_alloc_zeroed$' --requests 300

The dumps of `bench/instructions.py` hold one phase each (`.1` healthz, `.2` join,
`.3` status). With the pattern above it counts heap allocations per request and who makes
them, exactly and whatever else runs on the machine: callgrind counts calls, not time.
"""

import argparse
import collections
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("callee", help="regular expression on the called function's name")
    ap.add_argument("--requests", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    callee = re.compile(a.callee)
    names = {}

    def name(text):
        # Callgrind compresses names: "(12) name" the first time, "(12)" after.
        m = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not m:
            return text
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), text)

    fn = cfn = None
    counts = collections.Counter()
    with open(a.dump, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                fn = name(line[3:].strip())
            elif line.startswith("cfn="):
                cfn = name(line[4:].strip())
            elif line.startswith("calls=") and cfn and callee.search(cfn):
                counts[fn] += int(line[6:].split()[0])
    print(f"{sum(counts.values()) / a.requests:.2f} calls per request")
    for caller, n in counts.most_common(a.top):
        print(f"{n / a.requests:8.2f}  {caller[:200]}")


if __name__ == "__main__":
    main()
