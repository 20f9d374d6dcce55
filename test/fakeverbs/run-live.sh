#!/bin/sh
# The live verbs unit tests (test_ib_live: transfers, grouped receives, the
# flush, the eager ring, injected faults) on the fake provider, once per
# description in test/fakeverbs/conf/. Usage: run-live.sh BUILD_DIR
set -eu
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
lib=$(cd "$build" && pwd)/test/fakeverbs/libfakeverbs.so
mlx5=$(cd "$build" && pwd)/test/fakeverbs/libfakemlx5.so
for conf in "$here"/conf/*.conf; do
	dir=$(mktemp -d /tmp/rail-fakeverbs-live-XXXXXX)
	echo "== test_ib_live on $(basename "$conf")"
	orders=safe,inorder
	if grep -q '^[^#]*reorder=yes' "$conf"; then orders=safe; fi
	if ! RAIL_TEST_EAGER_ORDERS=$orders NCCL_IBVERBS_LIB=$lib NCCL_RAIL_MLX5_LIB=$mlx5 RAIL_FAKEVERBS_CONF=$conf \
	    RAIL_FAKEVERBS_SYSFS=$dir NCCL_RAIL_SYSFS_ROOT=$dir NCCL_SOCKET_IFNAME=lo RAIL_TEST_REQUIRE_RDMA=1 \
	    "$build/test/unit/test_ib_live"; then
		echo "test_ib_live failed on $conf (kept $dir)" >&2
		exit 1
	fi
	rm -rf "$dir"
done
