#!/bin/bash
# Every thread's stack of running processes that were started with
# build/test/nccl/stackdump.so preloaded (test/nccl/stackdump.c), with each frame
# named: the function from the object's symbol table (nm: local functions
# too, where the object is not stripped), and file:line from its debug
# information where it has some (addr2line; the plugin is built with -g).
#
#   test/nccl/stackdump.sh PID...      (prints to stdout)
#
# Dump a process only just before killing it: a thread interrupted in a call
# the kernel does not restart (poll, epoll_wait, nanosleep) returns EINTR.
# env: STACKDUMP_DIR (where the preload writes, default /tmp).
set -u
dir=${STACKDUMP_DIR:-/tmp}
for pid in "$@"; do
	before=$(ls "$dir"/stacks."$pid".* 2>/dev/null | wc -l)
	kill -s RTMIN+5 "$pid" || continue
	f=$dir/stacks.$pid.$before
	# written thread by thread: done once it stops growing
	last=-1
	for _ in $(seq 50); do
		sleep 0.2
		size=$(stat -c %s "$f" 2>/dev/null || echo -1)
		[ "$size" -gt 0 ] && [ "$size" = "$last" ] && break
		last=$size
	done
	echo "##### pid $pid ($f)"
	python3 - "$f" <<'EOF'
import bisect, re, subprocess, sys

lines = open(sys.argv[1], errors="replace").read().splitlines()
base = {}
for l in lines:
    m = re.match(r"^([0-9a-f]+)-[0-9a-f]+ \S+ ([0-9a-f]+) \S+ \S+\s+(/\S+)$", l)
    if m and m.group(3) not in base:
        base[m.group(3)] = int(m.group(1), 16) - int(m.group(2), 16)
syms = {}

def lookup(obj, off):
    if obj not in syms:
        out = ""
        for dyn in ([], ["-D"]):	# the symbol table, else the dynamic one (stripped)
            try:
                out = subprocess.run(["nm", "-n", "--defined-only"] + dyn + [obj],
                                     capture_output=True, text=True).stdout
            except OSError:
                pass
            if out.strip():
                break
        t = [(int(a, 16), n) for a, k, n in (x.split(None, 2) for x in out.splitlines()
             if len(x.split(None, 2)) == 3) if k in "tTwW"]
        syms[obj] = ([a for a, _ in t], [n for _, n in t])
    addrs, names = syms[obj]
    i = bisect.bisect_right(addrs, off) - 1
    name = "%s+0x%x" % (names[i], off - addrs[i]) if i >= 0 else "?"
    if "rail" in obj or "stackdump" in obj:
        try:
            fl = subprocess.run(["addr2line", "-e", obj, hex(off)], capture_output=True,
                                text=True).stdout.strip()
            if fl and not fl.startswith("??"):
                name += " " + fl.split("/src/")[-1].split("/test/")[-1]
        except OSError:
            pass
    return name

for l in lines:
    if l.startswith("==="):
        print(l)
        continue
    m = re.match(r"^(/?\S+?)\((.*)\)\[0x([0-9a-f]+)\]$", l)
    if not m:
        continue
    obj, addr = m.group(1), int(m.group(3), 16)
    path = next((p for p in base if p.endswith(obj.lstrip("."))), obj)
    b = base.get(path)
    where = lookup(path, addr - b - 1) if b is not None else "?"
    if where == "?" and m.group(2):
        where = m.group(2)
    print("    %s  %s" % (path.rsplit("/", 1)[-1], where))
EOF
done
