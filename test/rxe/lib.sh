# Helpers for the Soft-RoCE guest scripts and tests.d/ scripts (bash).
#   . "$RXE_HARNESS/lib.sh"
# Nothing here runs on source; every function is rxe_-prefixed.

# Never fork+exec per GID slot: an rxe port has 1024 of them, and a
# fork+exec per slot takes seconds in the emulated guest.

# rxe_ipv4_gid_index DEV IP [PORT]: print the index of DEV's RoCE v2 GID that
# is the IPv4-mapped form of IP (::ffff:a.b.c.d). Fails if there is none yet.
rxe_ipv4_gid_index() {
    local dev=$1 ip=$2 port=${3:-1} a b c d want i gid type
    local base=/sys/class/infiniband/$dev/ports/$port
    IFS=. read -r a b c d <<<"$ip"
    printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
    for ((i = 0; ; i++)); do
        [ -e "$base/gids/$i" ] || return 1
        gid=
        read -r gid <"$base/gids/$i" 2>/dev/null
        [ "$gid" = "$want" ] || continue
        type=
        read -r type <"$base/gid_attrs/types/$i" 2>/dev/null
        [ "$type" = "RoCE v2" ] || continue
        echo "$i"
        return 0
    done
}

# rxe_gid_table DEV [PORT]: print the non-empty GIDs with their type and netdev.
rxe_gid_table() {
    local dev=$1 port=${2:-1} i gid type ndev
    local base=/sys/class/infiniband/$dev/ports/$port
    # one grep reads the 1024 slots faster than a shell loop
    (cd "$base/gids" && grep -H -v '^0000:0000:0000:0000:0000:0000:0000:0000$' -- * 2>/dev/null) |
        sort -n | while IFS=: read -r i gid; do
        type='' ndev=''
        read -r type <"$base/gid_attrs/types/$i" 2>/dev/null
        read -r ndev <"$base/gid_attrs/ndevs/$i" 2>/dev/null
        printf '%s port %s gid[%s] %s %s %s\n' "$dev" "$port" "$i" "$gid" "$type" "$ndev"
    done
}

# rxe_wait_listen PORT [TIMEOUT_S]: wait until a TCP socket listens on PORT
# (IPv4 or IPv6). Use it between starting a server and its client: perftest
# and ibv_rc_pingpong clients try to connect once and give up.
rxe_wait_listen() {
    local port=$1 timeout=${2:-30} hex deadline
    hex=$(printf ':%04X ' "$port")
    deadline=$((SECONDS + timeout))
    while [ $SECONDS -lt "$deadline" ]; do
        # local_address is field 2, st (0A = LISTEN) field 4
        if awk -v p="$hex" 'NR > 1 && $4 == "0A" && index($2 " ", p) { f = 1 } END { exit !f }' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    echo "rxe_wait_listen: nothing listens on port $port after ${timeout}s" >&2
    return 1
}

# rxe_pair NAME PORT TIMEOUT_S SERVER_CMD... -- CLIENT_CMD...
# Start the server in the background, wait for it to listen on PORT, run the
# client, then wait for the server. Both run under `timeout TIMEOUT_S` (rxe
# treats retry_cnt 7, which perftest and ibv_rc_pingpong use, as "retry
# forever", so a lost peer never errors out by itself). Output lines are
# prefixed with "NAME server| " / "NAME client| ". Fails unless both exit 0.
rxe_pair() {
    local name=$1 port=$2 tmo=$3
    shift 3
    local server=() client=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do server+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    client=("$@")
    [ ${#server[@]} -gt 0 ] && [ ${#client[@]} -gt 0 ] || {
        echo "rxe_pair: usage: rxe_pair NAME PORT TIMEOUT SERVER... -- CLIENT..." >&2
        return 2
    }
    local spid src=0 crc=0
    echo "$name: server: ${server[*]}"
    echo "$name: client: ${client[*]}"
    timeout -k 5 "$tmo" "${server[@]}" > >(sed -u "s/^/$name server| /") 2>&1 &
    spid=$!
    if ! rxe_wait_listen "$port" "$tmo"; then
        kill "$spid" 2>/dev/null
        wait "$spid"
        echo "$name: server did not start listening on port $port"
        return 1
    fi
    timeout -k 5 "$tmo" "${client[@]}" > >(sed -u "s/^/$name client| /") 2>&1 || crc=$?
    wait "$spid" || src=$?
    if [ "$src" != 0 ] || [ "$crc" != 0 ]; then
        echo "$name: FAILED (server rc $src, client rc $crc; 124 = timeout ${tmo}s)"
        return 1
    fi
    echo "$name: ok"
}

# rxe_port_state DEV [PORT]: print the port's state word (ACTIVE, DOWN, ...)
# from sysfs ("4: ACTIVE" -> ACTIVE), without forking.
rxe_port_state() {
    local s=''
    read -r s <"/sys/class/infiniband/$1/ports/${2:-1}/state" || return 1
    echo "${s#*: }"
}

# rxe_outer_link DEV: print the far end of the veth under DEV (in the bridge
# topology br0pN, the bridge port: taking it down fails DEV's port alone,
# while the inner end, DEV's netdev, keeps its address and routes).
rxe_outer_link() {
    local dev=$1 ndev peer f idx
    ndev=$(rdma link show "$dev/1" | sed -n 's/.* netdev \([^ ]*\).*/\1/p')
    [ -n "$ndev" ] || { echo "rxe_outer_link: $dev has no netdev" >&2; return 1; }
    read -r peer <"/sys/class/net/$ndev/iflink" || return 1
    for f in /sys/class/net/*/ifindex; do
        read -r idx <"$f" || continue
        [ "$idx" = "$peer" ] || continue
        f=${f%/ifindex}
        [ "${f##*/}" != "$ndev" ] || break
        echo "${f##*/}"
        return 0
    done
    echo "rxe_outer_link: $ndev of $dev is not one end of a veth pair" >&2
    return 1
}

# _rxe_us SEC: print SEC (a decimal, "2" or "0.25") in microseconds.
_rxe_us() {
    local i=${1%%.*} f=
    [[ $1 == *.* ]] && f=${1#*.}
    f=${f}000000
    echo $((10#${i:-0} * 1000000 + 10#${f:0:6}))
}

# _rxe_nap SEC: sleep without an exec (each exec costs ~0.1 s in the guest).
_rxe_nap() {
    local fd
    exec {fd}<> <(:)
    read -rt "$1" -u "$fd" || true
    exec {fd}<&-
}

# _rxe_wait_port DEV WANT MAX_S: poll DEV's port state every 10 ms until it
# is (WANT=ACTIVE) or is no longer (WANT=!ACTIVE) ACTIVE; 1 after MAX_S.
_rxe_wait_port() {
    local dev=$1 want=$2 end s fd rc=0
    end=$((${EPOCHREALTIME/./} + $(_rxe_us "$3")))
    exec {fd}<> <(:)
    while :; do
        s=
        read -r s <"/sys/class/infiniband/$dev/ports/1/state"
        if [ "$want" = ACTIVE ]; then [[ $s == *ACTIVE ]] && break; else [[ $s != *ACTIVE ]] && break; fi
        [ "${EPOCHREALTIME/./}" -lt "$end" ] || { rc=1; break; }
        read -rt 0.01 -u "$fd" || true
    done
    exec {fd}<&-
    return $rc
}

# rxe_link_flap DEV READY_FILE DOWN_S EVENTS_FILE [READY_TIMEOUT_S]
# For the failover tests (bridge topology): wait until READY_FILE has a line
# READY (written by the process under test; default wait 120 s), take DEV's
# outer link (rxe_outer_link) down, keep it down DOWN_S seconds (fractions
# allowed) counted from the ip command, bring it up, and wait (30 s at most)
# for the port to be ACTIVE again. Appends one line per step to EVENTS_FILE,
# "<epoch s.us> <event> <DEV> <outer link> [detail]", with events ready,
# link-down, port-down (the port left ACTIVE), link-up, port-active; a port
# that did not change is logged as port-down-timeout / port-active-timeout
# and fails the call. Timestamps come from $EPOCHREALTIME (the date +%s.%N
# clock, without an exec) taken just before each ip command and just after
# each state change was seen (polled every 10 ms). Run it in the background
# next to the process; returns 0 if every step happened.
rxe_link_flap() {
    local dev=$1 ready=$2 down_s=$3 events=$4 rtmo=${5:-120} outer t0 t rc=0 left
    outer=$(rxe_outer_link "$dev") || return 1
    local deadline=$((SECONDS + rtmo))
    until [ -f "$ready" ] && grep -qx 'READY' "$ready"; do
        [ $SECONDS -lt $deadline ] || {
            echo "$EPOCHREALTIME ready-timeout $dev $outer no READY in $ready after ${rtmo}s" >>"$events"
            return 1
        }
        _rxe_nap 0.05
    done
    echo "$EPOCHREALTIME ready $dev $outer" >>"$events"
    t0=$EPOCHREALTIME
    ip link set "$outer" down || return 1
    echo "$t0 link-down $dev $outer" >>"$events"
    if _rxe_wait_port "$dev" '!ACTIVE' "$down_s"; then
        t=$EPOCHREALTIME
        echo "$t port-down $dev $outer $(rxe_port_state "$dev")" >>"$events"
    else
        echo "$EPOCHREALTIME port-down-timeout $dev $outer still ACTIVE" >>"$events"
        rc=1
    fi
    left=$((${t0/./} + $(_rxe_us "$down_s") - ${EPOCHREALTIME/./}))
    [ "$left" -gt 0 ] && _rxe_nap "$((left / 1000000)).$(printf %06d $((left % 1000000)))"
    t0=$EPOCHREALTIME
    ip link set "$outer" up || return 1
    echo "$t0 link-up $dev $outer" >>"$events"
    if _rxe_wait_port "$dev" ACTIVE 30; then
        echo "$EPOCHREALTIME port-active $dev $outer" >>"$events"
    else
        echo "$EPOCHREALTIME port-active-timeout $dev $outer $(rxe_port_state "$dev")" >>"$events"
        rc=1
    fi
    return $rc
}
