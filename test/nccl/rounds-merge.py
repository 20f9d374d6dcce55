#!/usr/bin/env python3
"""Markdown table of allreduce-rounds.sh runs: per column, the median time (us)
over the rounds of one mode (and the median busbw in GB/s from 32 MiB);
with MERGE_CPU=1, the median CPU seconds per GB moved instead (from 32 MiB).

  test/nccl/rounds-merge.py "2r rail@LOGS:2:rail" "2r Socket@LOGS:2:socket" ...
"""
import glob, os, re, statistics, sys
def rows(path):
    out = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) in (8, 9) and f[0].isdigit() and f[2] == "float":
            out[int(f[0])] = (float(f[4]), float(f[6]), float(f[8]) if len(f) == 9 else -1)
    return out
def size_str(b):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= v and b % v == 0:
            return f"{b // v} {unit}"
    return f"{b} B"
# args: LABEL@DIR:NP:MODE ...
cols = []
for a in sys.argv[1:]:
    label, spec = a.split("@", 1)
    d, np_, mode = spec.split(":", 2)
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", mode)
    runs = [rows(p) for p in sorted(glob.glob(f"{d}/np{np_}-{tag}_-[0-9].out"))]
    cols.append((label, runs))
sizes = sorted(set().union(*[r.keys() for _, runs in cols for r in runs]))
cpu = os.environ.get("MERGE_CPU") == "1"
if cpu:
    sizes = [s for s in sizes if s >= (32 << 20)]
print("| size | " + " | ".join(l for l, _ in cols) + " |")
print("|---:" * (len(cols) + 1) + "|")
for s in sizes:
    cells = []
    for l, runs in cols:
        t = [r[s][0] for r in runs if s in r]
        b = [r[s][1] for r in runs if s in r]
        c = [r[s][2] for r in runs if s in r and r[s][2] >= 0]
        if not t or (cpu and not c): cells.append("-"); continue
        if cpu:
            cells.append(f"{statistics.median(c):.2f}")
            continue
        tm = statistics.median(t)
        cells.append(f"{tm:.0f}" if s < (32 << 20) else f"{tm:.0f} ({statistics.median(b):.2f})")
    print(f"| {size_str(s)} | " + " | ".join(cells) + " |")
