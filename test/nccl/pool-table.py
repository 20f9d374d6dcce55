#!/usr/bin/env python3
"""Median time (us) and busbw per size over the rounds of pool-session.sh.

  test/nccl/pool-table.py LOGS NP MODE [MODE...]
prints a Markdown table: size, then per mode the median time of its rounds
(min-max) and the median busbw, and the ratio of the first mode's median
time to the last's (the last is usually socket)."""
import glob, re, statistics, sys

def rows(path):
    out = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) == 8 and f[0].isdigit() and f[2] == "float":
            out[int(f[0])] = (float(f[4]), float(f[6]))
    return out

def size_str(b):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= v and b % v == 0:
            return f"{b // v} {unit}"
    return f"{b} B"

logs, np_, modes = sys.argv[1], sys.argv[2], sys.argv[3:]
data = {}
for m in modes:
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", m)
    runs = [rows(p) for p in sorted(glob.glob(f"{logs}/np{np_}-{tag}_-[0-9].out"))]
    data[m] = runs
sizes = sorted(set().union(*[r.keys() for m in modes for r in data[m]]))
head = "| size | " + " | ".join(f"{m} time us (min-max) | busbw" for m in modes)
head += f" | {modes[0]} / {modes[-1]} |" if len(modes) > 1 else " |"
print(f"{len(data[modes[0]])} rounds per mode; median of the rounds")
print(head)
print("|---:" * (1 + 2 * len(modes) + (len(modes) > 1)) + "|")
for s in sizes:
    cells, med = [], []
    for m in modes:
        t = [r[s][0] for r in data[m] if s in r]
        b = [r[s][1] for r in data[m] if s in r]
        if not t:
            cells += ["-", "-"]; med.append(None); continue
        med.append(statistics.median(t))
        cells += [f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f})",
                  f"{statistics.median(b):.2f}"]
    ratio = f" | {med[0] / med[-1]:.2f}" if len(modes) > 1 and med[0] and med[-1] else ""
    print(f"| {size_str(s)} | " + " | ".join(cells) + ratio + " |")
