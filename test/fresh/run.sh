#!/usr/bin/env bash
# The fresh-machine test (make test-fresh): what a newcomer meets on a new
# Debian 12, Ubuntu 22.04 or Ubuntu 24.04 machine, proven in roots built from
# each one's own packages.
#
#   test/fresh/run.sh [--keep] [--quick] [PART...]
#
# Parts (all by default): quickstart package ubuntu-jammy ubuntu-noble.
# 1. debootstrap --variant=minbase of the suite (bookworm; jammy, noble from
#    the Ubuntu archive, checked against the Ubuntu archive key: the host's
#    /usr/share/keyrings/ubuntu-archive-keyring.gpg, else the copy beside this
#    script, ubuntu-archive-2018.asc), cached as a tarball in
#    /var/cache/nccl-net-rail/fresh (FRESH_CACHE to change; outside the
#    checkout, so a clean clone on the same machine reuses it), rebuilt after
#    7 days, unpacked anew for each part: only the untouched debootstrap
#    output is kept, and every part installs its packages anew. The root gets what a
#    cloud image also has and minbase lacks: sudo, a user "newcomer" who may
#    use it, apt sources (Debian: the host's, main, updates, security; Ubuntu:
#    main and universe of the suite, -updates and -security) and resolv.conf.
#    Nothing of the project's.
# 2. quickstart (bookworm), ubuntu-jammy, ubuntu-noble: the checkout (tracked
#    files and new, not ignored ones; never build/) is copied to
#    /home/newcomer/nccl-net-rail, and the command lines of README.md between
#    <!-- quickstart:begin --> and <!-- quickstart:end --> run there, one by
#    one, as newcomer, exactly as written. After the first line the plugin
#    and tools must be built, and libcmocka-dev not installed. `sudo .ci/run`
#    runs only for the suites in FRESH_CI_SUITES (default: bookworm; e.g.
#    FRESH_CI_SUITES="bookworm jammy noble"), with RAIL_CI_TARGET="test-unit-smoke
#    test-netns-smoke test-rxe-smoke" (FOSEARCH_SEEDS=200 is kept through sudo
#    by the root's sudoers for a wider target): it installs every test
#    dependency and the Soft-RoCE kernel, as on CI, then runs the unit tests
#    that need what the machine provides (cmocka, sockets, libibverbs'
#    headers, sysfs, rlimits), rail-bench between two network namespaces (the
#    system's iproute2; the other netns tests, timing-bound failover cases
#    that take about 3 minutes, test the code and run on the host) and boots
#    the Soft-RoCE guest once. The rest of make check tests the code,
#    not the machine: the host's make test runs it (and this test again if
#    it ran make test here).
# 3. package (bookworm): a second fresh root gets build/pkg/nccl-net-rail_*.deb
#    with `apt-get install ./file.deb` only, then: rail-info --version;
#    rail-info --check with NCCL_NET_PLUGIN=rail must find the plugin NCCL
#    would load, by name, in the system library directory; a two-process
#    rail-bench run with its byte check. (Not on Ubuntu: the .deb is built
#    on the Debian host, against its libc.)
# --quick skips every `sudo .ci/run` line (QEMU and the guest).
# Mirrors: none is named here. Debian's comes from the host's own apt sources
# (sources.list, sources.list.d/*.list and deb822 *.sources: the first entry
# of the suite, so a local mirror or proxy is followed), else debootstrap's
# built-in default. Ubuntu's is debootstrap's default for the suite (its
# script's), read back from the root it made; -updates and -security come
# from the same mirror. FRESH_MIRROR (Debian), FRESH_UBUNTU_MIRROR and
# FRESH_UBUNTU_SECURITY_MIRROR override them.
# Every part runs in a private mount namespace (unshare -m), so /proc, /sys
# and /dev/pts mounted for the root vanish with it. Output of each part goes
# to build/fresh-runs/<part>.log; the last 40 lines are printed on failure.
# Exit status: 0 pass, 1 a step failed, 2 cannot run here (not root, no
# debootstrap); a skip says why.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${FRESH_CACHE:-/var/cache/nccl-net-rail/fresh}
RUNS=$REPO/build/fresh-runs
MIRROR=${FRESH_MIRROR:-}
UBUNTU_MIRROR=${FRESH_UBUNTU_MIRROR:-}
UBUNTU_SECURITY=${FRESH_UBUNTU_SECURITY_MIRROR:-}
CI_SUITES=" ${FRESH_CI_SUITES-bookworm} "
USER_NAME=newcomer
ALL_PARTS=(quickstart package ubuntu-jammy ubuntu-noble)

keep=0
quick=0
parts=()
for arg in "$@"; do
	case $arg in
	--keep) keep=1 ;;
	--quick) quick=1 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; exit 0 ;;
	quickstart | package | ubuntu-jammy | ubuntu-noble) parts+=("$arg") ;;
	*) echo "fresh: unknown argument $arg (parts: ${ALL_PARTS[*]})" >&2; exit 2 ;;
	esac
done
[ ${#parts[@]} -gt 0 ] || parts=("${ALL_PARTS[@]}")

log() { printf 'fresh: [%4ds] %s\n' "$SECONDS" "$*"; }
die() { echo "fresh: FAIL: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
	echo "SKIP: fresh: needs root (debootstrap, chroot, mounts)"
	exit 0
fi
command -v debootstrap >/dev/null || { echo "fresh: debootstrap not installed (apt-get install debootstrap)" >&2; exit 2; }
command -v unshare >/dev/null || { echo "fresh: unshare not found (util-linux)" >&2; exit 2; }

mkdir -p "$CACHE" "$RUNS"

# distro_of SUITE: debian or ubuntu.
distro_of() {
	case $1 in
	jammy | noble) echo ubuntu ;;
	*) echo debian ;;
	esac
}

# The Ubuntu archive key for debootstrap (gpgv wants it unarmored): the
# host's keyring where ubuntu-keyring is installed (not in Debian 12), else
# the Ubuntu Archive Automatic Signing Key (2018), fingerprint
# F6EC B376 2474 EDA9 D21B  7022 8719 20D1 991B C93C, kept beside this script
# and unarmored with base64 (no gpg needed).
ubuntu_keyring() {
	local host=/usr/share/keyrings/ubuntu-archive-keyring.gpg out=$CACHE/ubuntu-archive-2018.gpg
	if [ -s "$host" ]; then
		echo "$host"
		return 0
	fi
	sed '1,/^$/d;/^=/d;/^-----END/d' "$HERE/ubuntu-archive-2018.asc" | base64 -d >"$out.tmp"
	mv "$out.tmp" "$out"
	echo "$out"
}

# apt_uri SUITE FILE...: the URI of the first apt source of SUITE (not its
# -updates or -security) in FILEs, one-line (deb [options] URI SUITE ...) or
# deb822 (Types/URIs/Suites paragraphs); nothing when none has it.
apt_uri() {
	local suite=$1
	shift
	awk -v s="$suite" '
		function flush() {
			if (!found && deb && uri != "" && (" " suites " ") ~ (" " s " ")) {
				print uri; found = 1; exit
			}
			deb = 0; uri = ""; suites = ""
		}
		FNR == 1 { flush() }
		/^[ \t]*#/ { next }
		FILENAME ~ /\.sources$/ {
			if ($0 ~ /^[ \t]*$/) { flush(); next }
			if ($1 == "Types:") deb = ($0 ~ /[ \t]deb([ \t]|$)/)
			if ($1 == "URIs:") uri = $2
			if ($1 == "Suites:") { $1 = ""; suites = $0 }
			if ($1 == "Enabled:" && $2 == "no") deb = 0
			next
		}
		$1 == "deb" {
			i = 2
			if ($2 ~ /^\[/) while (i <= NF && $i !~ /\]$/) i++
			if ($2 ~ /^\[/) i++
			if ($(i + 1) == s) { print $i; found = 1; exit }
		}
		END { flush() }' "$@" 2>/dev/null
}

# host_mirror SUITE: the host's apt mirror of SUITE, if it has one.
host_mirror() {
	local files=() f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] && files+=("$f")
	done
	[ ${#files[@]} -gt 0 ] && apt_uri "$1" "${files[@]}"
	return 0
}

# base_root SUITE: the cached minbase root of SUITE, made once a week.
base_root() {
	local suite=$1 tarball=$CACHE/$1-minbase.tar
	local args=(--variant=minbase)
	if [ -s "$tarball" ] && [ -z "$(find "$tarball" -mtime +7)" ]; then
		return 0
	fi
	local tmp=$CACHE/.debootstrap.$$ dlog=$RUNS/debootstrap-$suite.log t0=$SECONDS
	rm -rf "$tmp"
	if [ "$(distro_of "$suite")" = ubuntu ]; then
		# No mirror named: debootstrap's script has the suite's default.
		# Debian 12's debootstrap has no script for noble; every Ubuntu
		# suite's script is a link to gutsy, and a script needs the mirror
		# argument before it, so then the default is read from it.
		local mirror=$UBUNTU_MIRROR script=/usr/share/debootstrap/scripts/$suite
		[ -e "$script" ] || script=/usr/share/debootstrap/scripts/gutsy
		[ -n "$mirror" ] || [ -e "/usr/share/debootstrap/scripts/$suite" ] ||
			mirror=$(script_mirror "$script" "$suite")
		args+=("--components=main,universe" "--keyring=$(ubuntu_keyring)" "$suite" "$tmp")
		[ -z "$mirror" ] || args+=("$mirror")
		[ -e "/usr/share/debootstrap/scripts/$suite" ] || args+=("$script")
	else
		local mirror=${MIRROR:-$(host_mirror "$suite")}
		args+=("$suite" "$tmp")
		[ -z "$mirror" ] || args+=("$mirror")
	fi
	log "debootstrap ${args[*]} (cached in $tarball)"
	if ! debootstrap "${args[@]}" >"$dlog" 2>&1; then
		tail -n 20 "$dlog" >&2
		rm -rf "$tmp"
		die "debootstrap $suite failed (log: $dlog)"
	fi
	log "debootstrap $suite: $((SECONDS - t0)) s"
	tar -C "$tmp" -cf "$tarball.tmp" .
	mv "$tarball.tmp" "$tarball"
	rm -rf "$tmp"
}

# Refuse to delete a root that still has something mounted under it.
remove_root() {
	local root=$1
	[ -d "$root" ] || return 0
	if grep -q " $root/" /proc/self/mounts; then
		echo "fresh: $root still has mounts; not removing it" >&2
		return 1
	fi
	rm -rf "$root"
}

cleanup() {
	local r
	for r in "$RUNS"/*.root; do
		[ -d "$r" ] || continue
		if [ "$keep" = 1 ]; then log "kept $r"; else remove_root "$r"; fi
	done
	return 0
}
trap cleanup EXIT

# script_mirror SCRIPT SUITE: the default mirror debootstrap's SCRIPT gives
# SUITE on this machine's architecture (the default_mirror of the first case
# arm that matches, as the script's own case statements pick it).
script_mirror() {
	awk -v arch="$(dpkg --print-architecture)" -v s="$2" '
		!inarch && $0 ~ ("(^|[ \t|])" arch "[|)]") { inarch = 1; next }
		inarch && !pick && /\)[ \t]*$/ {
			pat = $0; gsub(/[ \t)]/, "", pat); n = split(pat, a, "|")
			for (i = 1; i <= n; i++) if (a[i] == s || a[i] == "*") pick = 1
			next
		}
		inarch && pick && $1 == "default_mirror" { print $2; exit }' "$1"
}

# ubuntu_sources SUITE ROOT: the apt sources of an Ubuntu cloud image, main
# and universe (deb822 on noble, one-line sources.list on jammy, as each
# release ships them), on the mirror the root was made from (debootstrap
# wrote it in the root's sources.list) unless FRESH_UBUNTU_MIRROR names one.
ubuntu_sources() {
	local suite=$1 root=$2
	local mirror=${UBUNTU_MIRROR:-$(apt_uri "$suite" "$root/etc/apt/sources.list")}
	local security=${UBUNTU_SECURITY:-$mirror}
	[ -n "$mirror" ] || die "no mirror in $root/etc/apt/sources.list (set FRESH_UBUNTU_MIRROR)"
	rm -f "$root/etc/apt/sources.list"
	if [ "$suite" = jammy ]; then
		{
			echo "deb $mirror $suite main universe"
			echo "deb $mirror $suite-updates main universe"
			echo "deb $security $suite-security main universe"
		} >"$root/etc/apt/sources.list"
		return 0
	fi
	cat >"$root/etc/apt/sources.list.d/ubuntu.sources" <<-EOF
		Types: deb
		URIs: $mirror
		Suites: $suite $suite-updates
		Components: main universe
		Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

		Types: deb
		URIs: $security
		Suites: $suite-security
		Components: main universe
		Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
	EOF
}

# new_root NAME SUITE: a fresh copy of SUITE's cached root with the
# cloud-image basics, in $ROOT.
new_root() {
	local root=$RUNS/$1.root suite=$2
	ROOT=$root
	remove_root "$root"
	mkdir -p "$root"
	tar -C "$root" -xf "$CACHE/$suite-minbase.tar"
	if [ "$(distro_of "$suite")" = ubuntu ]; then
		ubuntu_sources "$suite" "$root"
	else
		rm -f "$root/etc/apt/sources.list"
		cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/" 2>/dev/null ||
			cp /etc/apt/sources.list "$root/etc/apt/sources.list"
	fi
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
	echo "fresh-$1" >"$root/etc/hostname"
	# The chroot keeps the host's UTS name: list it too, or sudo warns.
	printf '127.0.0.1 localhost fresh-%s %s\n::1 localhost\n' "$1" "$(uname -n)" >"$root/etc/hosts"
	in_root "$root" root "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo >/dev/null" ||
		die "cannot install sudo in the fresh root"
	in_root "$root" root "useradd -m -s /bin/bash $USER_NAME &&
		echo '$USER_NAME ALL=(ALL) NOPASSWD:ALL' >/etc/sudoers.d/$USER_NAME &&
		echo 'Defaults env_keep += \"RAIL_CI_TARGET FOSEARCH_SEEDS\"' >/etc/sudoers.d/rail-ci &&
		chmod 0440 /etc/sudoers.d/$USER_NAME /etc/sudoers.d/rail-ci"
}

# in_root ROOT USER COMMAND: run COMMAND with bash -e in ROOT as USER, in a
# private mount namespace with /proc, /sys and /dev/pts mounted.
in_root() {
	local root=$1 user=$2 cmd=$3
	unshare -m --propagation private bash -c '
		set -e
		root=$1; user=$2; cmd=$3
		# The root is a mount point, as / is on a machine (ip netns needs it).
		mount --bind "$root" "$root"
		mount -t proc proc "$root/proc"
		mount -t sysfs sysfs "$root/sys"
		mkdir -p "$root/dev/pts" "$root/dev/shm"
		mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
		mount -t tmpfs tmpfs "$root/dev/shm"
		mount -t tmpfs tmpfs "$root/run"
		exec chroot "$root" /usr/bin/env -i TERM=dumb \
			/usr/sbin/runuser -l "$user" -c "exec /bin/bash -e -o pipefail -c $(printf %q "$cmd")"
	' in_root "$root" "$user" "$cmd"
}

# The README's quick-start command lines (inside the code fence between the markers).
quickstart_lines() {
	sed -n '/^<!-- quickstart:begin -->$/,/^<!-- quickstart:end -->$/p' "$REPO/README.md" |
		sed -n '/^```/,/^```/p' | sed '/^```/d;/^[[:space:]]*$/d'
}

copy_checkout() {
	local dest=$1
	mkdir -p "$dest"
	(cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
		tar --null -T - -cf -) | tar -xf - -C "$dest"
	[ -d "$REPO/.git" ] && cp -a "$REPO/.git" "$dest/.git" 2>/dev/null || true
}

# run_part NAME COMMAND...: log to RUNS/NAME.log, print the tail on failure.
# The part runs in a subshell outside any condition, with set -e turned back
# on in it (it inherits the set +e here): any failed command fails the part.
run_part() {
	local name=$1 t0=$SECONDS rc=0
	shift
	log "$name ..."
	set +e
	(set -e; "$@") >"$RUNS/$name.log" 2>&1
	rc=$?
	set -e
	if [ "$rc" = 0 ]; then
		log "$name: ok ($((SECONDS - t0)) s)"
		return 0
	fi
	echo "---- last lines of $RUNS/$name.log" >&2
	tail -n 40 "$RUNS/$name.log" >&2
	die "$name failed after $((SECONDS - t0)) s"
}

# quickstart NAME SUITE: the README's quick-start lines in a fresh SUITE root.
quickstart() {
	local name=$1 suite=$2 root src n=0 line t0
	new_root "$name" "$suite"
	root=$ROOT
	in_root "$root" root ". /etc/os-release && echo \"== \$PRETTY_NAME, \$(uname -m), glibc \$(ldd --version | head -n1 | sed 's/.* //')\""
	src=$root/home/$USER_NAME/nccl-net-rail
	copy_checkout "$src"
	in_root "$root" root "chown -R $USER_NAME: /home/$USER_NAME/nccl-net-rail"
	mapfile -t lines < <(quickstart_lines)
	[ "${#lines[@]}" -ge 2 ] || die "README.md has no quick-start block with two commands (markers <!-- quickstart:begin/end -->)"
	for line in "${lines[@]}"; do
		n=$((n + 1))
		t0=$SECONDS
		case $line in
		*".ci/run"*)
			[ "$quick" = 1 ] && { echo "SKIP: quick-start line $n ($line): --quick"; continue; }
			[[ $CI_SUITES == *" $suite "* ]] ||
				{ echo "SKIP: quick-start line $n ($line): $suite is not in FRESH_CI_SUITES"; continue; }
			echo "== quick-start line $n: $line   (RAIL_CI_TARGET=test-unit-smoke test-netns-smoke test-rxe-smoke)"
			in_root "$root" "$USER_NAME" "cd ~/nccl-net-rail && export RAIL_CI_TARGET='test-unit-smoke test-netns-smoke test-rxe-smoke' FOSEARCH_SEEDS=200 && $line"
			;;
		*)
			echo "== quick-start line $n: $line"
			in_root "$root" "$USER_NAME" "cd ~/nccl-net-rail && $line"
			;;
		esac
		echo "== quick-start line $n: ok ($((SECONDS - t0)) s)"
		if [ "$n" = 1 ]; then
			# The first line must have built everything without cmocka.
			in_root "$root" "$USER_NAME" "cd ~/nccl-net-rail && test -x build/libnccl-net-rail.so &&
				test -x build/rail-info && test -x build/rail-bench && ! dpkg -s libcmocka-dev >/dev/null 2>&1" ||
				die "after quick-start line 1 the plugin and tools are not all built, or cmocka was installed"
		fi
	done
}

package() {
	local root deb multiarch
	multiarch=$(gcc -print-multiarch)
	deb=$(ls "$REPO"/build/pkg/nccl-net-rail_"$(cat "$REPO/VERSION")"_*.deb 2>/dev/null | head -n1 || true)
	[ -n "$deb" ] || die "no .deb in build/pkg (make deb)"
	new_root package bookworm
	root=$ROOT
	cp "$deb" "$root/tmp/"
	in_root "$root" "$USER_NAME" "cd /tmp && sudo apt-get install -y ./$(basename "$deb")"
	in_root "$root" "$USER_NAME" "multiarch=$multiarch"'
		set -x
		rail-info --version
		rail-bench --version
		rail-rawtcp --version
		# NCCL_NET_PLUGIN=rail must find the installed plugin by name, without ldconfig or LD_LIBRARY_PATH.
		rc=0; NCCL_NET_PLUGIN=rail rail-info --check >/tmp/check.txt 2>&1 || rc=$?
		cat /tmp/check.txt
		[ "$rc" -le 1 ] || { echo "rail-info --check exited $rc"; exit 1; }
		# The report names the file NCCL would load and its version.
		NCCL_NET_PLUGIN=rail rail-info >/tmp/info.txt 2>&1 || true
		grep "rail: /usr/lib/$multiarch/libnccl-net-rail.so: nccl-net-rail" /tmp/info.txt
		NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo rail-bench -e 1M -c
	'
}

suite_of() {
	case $1 in
	quickstart | package) echo bookworm ;;
	ubuntu-*) echo "${1#ubuntu-}" ;;
	esac
}

# one_part PART: run it, then remove its root (kept with --keep).
one_part() {
	local part=$1
	case $part in
	quickstart) run_part quickstart quickstart quickstart bookworm ;;
	package) run_part package package ;;
	ubuntu-*) run_part "$part" quickstart "$part" "${part#ubuntu-}" ;;
	esac
	[ "$keep" = 1 ] || remove_root "$RUNS/$part.root"
}

# The base roots first, one at a time (debootstrap, when the cache is old).
# Then every part at once, each in its own root: most of their time is apt
# downloads and package installs, which wait on the network more than on the
# CPUs; quickstart, the longest, boots the Soft-RoCE guest at its end, after
# the others are done.
t0=$SECONDS
for part in "${parts[@]}"; do
	base_root "$(suite_of "$part")"
done
pids=() names=() failed=()
for part in "${parts[@]}"; do
	one_part "$part" &
	pids+=($!) names+=("$part")
done
for i in "${!pids[@]}"; do
	wait "${pids[$i]}" || failed+=("${names[$i]}")
done
[ ${#failed[@]} = 0 ] || die "failed: ${failed[*]} (logs: $RUNS/<part>.log)"
log "all passed in $((SECONDS - t0)) s (${parts[*]})"
