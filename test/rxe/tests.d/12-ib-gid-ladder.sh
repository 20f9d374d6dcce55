#!/bin/bash
# What the verbs transport decides on the rxe devices, through rail-info
# (the same functions the transport uses): the RoCE GID it picks must be the
# first valid IPv4-mapped RoCE v2 GID found in sysfs (RXE_GID_INDEX0/1), and
# the GPU-memory ladder must conclude "DMA-BUF unsupported" (rxe has no dmabuf
# MRs) and fall back to host memory only, with ptrSupport = HOST. The plugin's
# own init lines must say the same.
# rxe-timeout: 120
set -uo pipefail

# Exit status 0 ready or 1 usable with warnings (NCCL_NET_PLUGIN is unset here).
rc=0; json=$(build/rail-info --json 2>/dev/null) || rc=$?
[ "$rc" -le 1 ] || { echo "rail-info --json exited $rc"; exit 1; }
printf '%s\n' "$json" >"$RXE_TEST_OUT/rail-info.json"

python3 - "$RXE_GID_INDEX0" "$RXE_GID_INDEX1" "$RXE_TEST_OUT/rail-info.json" <<'PY' || exit 1
import json, sys
want = {"rxe0": int(sys.argv[1]), "rxe1": int(sys.argv[2])}
with open(sys.argv[3]) as f:
    doc = json.load(f)
ib = doc["verbs"]
assert ib["library_loaded"] and ib["devices"], f"verbs report: {ib}"
bad = 0
for d in ib["devices"]:
    name = d["name"]
    if name not in want:
        continue
    p = d["ports"][0]
    print(f"{name}: GID {p['gid_chosen']} ({p['gid_reason']}); sysfs says {want[name]}")
    if p["gid_chosen"] != want[name] or "IPv4 RoCE v2" not in p["gid_reason"]:
        print(f"FAILED: {name} chose GID {p['gid_chosen']}, expected {want[name]}")
        bad += 1
    g = d["gpu_memory"]
    print(f"{name}: ladder: {g['result']}; DMA-BUF: {g['dmabuf_check']}; peermem: {g['peermem_check']}")
    if g["dmabuf"] or "Operation not supported" not in g["dmabuf_check"]:
        print(f"FAILED: {name}: the DMA-BUF probe should conclude EOPNOTSUPP on rxe")
        bad += 1
    if g["ptr_support"] != 1 or g["result"] != "host memory only":
        print(f"FAILED: {name}: ptrSupport {g['ptr_support']}, result {g['result']}")
        bad += 1
sys.exit(1 if bad else 0)
PY

# The transport's own log lines at init (one GID line per port, one ladder line per device).
log=$(NCCL_DEBUG=INFO NCCL_RAIL_TRANSPORT=ib build/rail-info 2>&1 >/dev/null)
for d in rxe0 rxe1; do
    printf '%s\n' "$log" | grep -q "$d:1: RoCE GID index" || { echo "no GID log line for $d"; exit 1; }
    printf '%s\n' "$log" | grep -q "$d: host memory only: DMA-BUF unusable" ||
        { echo "no ladder log line for $d"; exit 1; }
done
# NCCL_DMABUF_ENABLE=0 skips the probe and says why.
off=$(NCCL_DMABUF_ENABLE=0 build/rail-info --json 2>/dev/null)
printf '%s\n' "$off" | grep -q 'disabled by NCCL_DMABUF_ENABLE=0' ||
    { echo "NCCL_DMABUF_ENABLE=0 not reported"; exit 1; }
echo "GID choice and GPU-memory ladder as expected"
