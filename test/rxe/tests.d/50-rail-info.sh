#!/bin/bash
# rail-info on real verbs: both rxe devices, their GID tables with the
# chosen GID (the first valid IPv4-mapped RoCE v2 entry, looked up in
# sysfs), the GPU-memory ladder concluding "host memory only" with the
# reason each higher rung failed, valid JSON; and a snapshot of the sysfs
# files it read gives the same answer as the live system.
# rxe-timeout: 120
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

info=build/rail-info
[ -x "$info" ] || { echo "$info missing: run make all"; exit 1; }
fails=0
check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); }
out=$(mktemp -d)

# Exit status 0 ready, 1 usable with warnings (NCCL_NET_PLUGIN is unset
# here), 2 not usable: the verbs transport must make it usable.
rc=0; "$info" >"$out/text" 2>&1 || rc=$?
[ "$rc" -le 1 ] || { echo "rail-info exited $rc:"; cat "$out/text"; exit 1; }
cat "$out/text"
rc=0; "$info" --json >"$out/live.json" || rc=$?
[ "$rc" -le 1 ] || { echo "rail-info --json exited $rc"; exit 1; }

for dev in rxe0 rxe1; do
    ip=$([ $dev = rxe0 ] && echo "$RXE_IP0" || echo "$RXE_IP1")
    want=$(rxe_ipv4_gid_index "$dev" "$ip") || { echo "$dev: no IPv4 GID in sysfs"; exit 1; }
    check python3 - "$out/live.json" "$dev" "$want" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); dev, want = sys.argv[2], int(sys.argv[3])
assert d["schema"] == 1 and d["transport"]["name"] == "ib", d["transport"]
devs = {x["name"]: x for x in d["verbs"]["devices"]}
assert dev in devs, f"{dev} missing from rail-info's verbs devices: {list(devs)}"
port = devs[dev]["ports"][0]
assert port["state"] == "ACTIVE" and port["used"], port
assert port["gid_chosen"] == want, f"{dev}: chose GID {port['gid_chosen']}, sysfs says {want}"
assert "IPv4" in port["gid_reason"] and "v2" in port["gid_reason"], port["gid_reason"]
assert len(port["gids"]) >= 2, "GID table not printed"
gm = devs[dev]["gpu_memory"]
assert gm["result"] == "host memory only", gm
assert not gm["dmabuf"] and "not supported" in gm["dmabuf_check"], gm["dmabuf_check"]
assert not gm["peermem"] and gm["peermem_check"], gm["peermem_check"]
print(f"{dev}: GID {want} chosen ({port['gid_reason']}); ladder: {gm['result']}")
PY
done
check grep -q "host memory only" "$out/text"
check grep -q "<= chosen" "$out/text"

# Snapshot round trip: what rail-info read, copied, then read back.
rc=0; "$info" --snapshot "$out/snap" >/dev/null 2>&1 || rc=$?
[ "$rc" -le 1 ] || { echo "rail-info --snapshot exited $rc"; exit 1; }
rc=0; "$info" --sysfs-root "$out/snap" --json >"$out/snap.json" || rc=$?
[ "$rc" -le 1 ] || { echo "rail-info --sysfs-root exited $rc"; exit 1; }
check python3 - "$out/live.json" "$out/snap.json" <<'PY'
import json, sys
live, snap = (json.load(open(p)) for p in sys.argv[1:3])
for d in (live, snap):
    d["topology"].pop("sysfs_root", None)
    d.pop("parameters", None)   # NCCL_RAIL_SYSFS_ROOT differs by design
diff = [k for k in live if live[k] != snap.get(k)]
assert not diff, f"snapshot differs from the live system in: {diff}"
print("snapshot round trip: identical (", ", ".join(sorted(live)), ")")
PY
rm -rf "$out"
[ "$fails" -eq 0 ] || exit 1
echo "rail-info: all checks passed"
