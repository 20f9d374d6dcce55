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
