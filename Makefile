# nccl-net-rail build.
#   make                  the plugin and the tools (a C compiler and the
#                         rdma-core headers, libibverbs-dev, are all it needs)
#   make check            quick tests: unit (cmocka), the verbs tests on the
#                         fake provider, exports, README table,
#                         conformance over TCP, rail-bench across namespaces,
#                         the scale check (128 pairs per transport)
#   make test             everything CI runs: check, sanitizers, clang, the
#                         fuzz targets (20 s each), the Soft-RoCE guest, the
#                         fresh-machine root, packages
#   make fuzz             every libFuzzer target for FUZZ_TIME s (clang)
#   make install          PREFIX, LIBDIR, BINDIR, DOCDIR, DESTDIR; with
#                         NCCL_DEFAULT_LINK=1 also libnccl-net.so, the name
#                         NCCL loads when NCCL_NET_PLUGIN is unset
#   make uninstall        the same variables
#   make deb / make rpm   packages in build/pkg/ (packaging/)
#
# One static core library (build/librail-core.a) links into the plugin,
# the tools and the tests. Sources are found by directory, so new files
# need no Makefile change:
#   src/*.c src/*/*.c      -> core library
#   plugin/*.c             -> the plugin's ABI shims
#   tools/<name>.c         -> build/<name> (underscores become dashes), with
#                             tools/<name>/*.c if that folder exists
#   test/unit/test_*.c     -> build/test/unit/test_* (cmocka)
#   test/fakeverbs/*.c     -> build/test/fakeverbs/libfakeverbs.so, the fake
#                             libibverbs the unit tests load (NCCL_IBVERBS_LIB)
#   test/fakeverbs/mlx5/   -> build/test/fakeverbs/libfakemlx5.so, its libmlx5
#                             (NCCL_RAIL_MLX5_LIB)
#   test/fakecuda/*.c      -> build/test/fakecuda/libfakecuda.so, the fake CUDA
#                             driver the RMA tests load (NCCL_RAIL_CUDA_LIB)
#   test/fuzz/fuzz_*.c     -> build-fuzz/test/fuzz/fuzz_* (libFuzzer, clang;
#                             make fuzz)
#   test/scale/*.c         -> build/test/scale/* (benchmarks on the fake provider)

CC      ?= gcc
BUILD   ?= build
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
BINDIR  ?= $(PREFIX)/bin
DOCDIR  ?= $(PREFIX)/share/doc/nccl-net-rail
NCCL_DEFAULT_LINK ?= 0
VERSION := $(shell cat VERSION)
WERROR  ?= 1
SAN     ?=
OPT     ?= -O2
V       ?= 0
ifeq ($(V),0)
Q       := @
endif

WARN    := -Wall -Wextra -Wshadow -Wformat=2 -Wmissing-prototypes -Wno-format-nonliteral
ifeq ($(WERROR),1)
WARN    += -Werror
endif
CPPFLAGS += -D_GNU_SOURCE -Iinclude -Isrc -DRAIL_VERSION='"$(VERSION)"'
CFLAGS  += -std=c11 $(OPT) -g -fPIC -fvisibility=hidden $(WARN) -pthread
LDLIBS  += -ldl -pthread
ifneq ($(SAN),)
CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SAN)
endif

# Link-time optimization (LTO=auto: on with gcc, off with another compiler
# or a sanitizer; LTO=0/1 to choose) of what ships and what is measured:
# the plugin, the tools and test/perf/pingpong. The data path crosses a
# dozen files (api, transport, engine, ring, wire format, pool, flight
# record); inlined across them it runs 15-20% fewer instructions per small
# message, and a third less time in the Soft-RoCE guest, where every call
# and return is an emulated indirect jump (docs/PERFORMANCE.md). Objects
# are fat (LTO bytecode and code): the unit tests link them plainly. auto
# also links a one-line program with -flto first: a gcc installed without
# its lto-wrapper (seen on the GPU machine) builds without LTO.
LTO     ?= auto
ifeq ($(LTO),auto)
LTO     := $(if $(SAN),0,$(shell $(CC) -v 2>&1 | grep -q '^gcc version' && \
	     echo 'int main(void) { return 0; }' | \
	     $(CC) -flto=auto -x c - -o /dev/null >/dev/null 2>&1 && echo 1 || echo 0))
endif
ifeq ($(LTO),1)
OBJ_LTO := -flto=auto -ffat-lto-objects
# maybe-uninitialized at link time sees across files, and differs from gcc to gcc
LD_LTO  := -flto=auto -Wno-error=maybe-uninitialized
NO_LTO  := -fno-lto
AR      := $(shell command -v gcc-ar >/dev/null 2>&1 && echo gcc-ar || echo $(AR))
endif

CORE_SRCS   := $(sort $(wildcard src/*.c src/*/*.c))
PLUGIN_SRCS := $(sort $(wildcard plugin/*.c))
TOOL_SRCS   := $(sort $(wildcard tools/*.c))
UNIT_SRCS   := $(sort $(wildcard test/unit/test_*.c))
CONF_SRCS   := $(sort $(wildcard test/conformance/*.c))
FAKEVERBS_SRCS := $(sort $(wildcard test/fakeverbs/*.c))
FAKECUDA_SRCS := $(sort $(wildcard test/fakecuda/*.c))
FUZZ_SRCS   := $(sort $(wildcard test/fuzz/fuzz_*.c))
SCALE_SRCS  := $(sort $(wildcard test/scale/*.c))

CORE_OBJS   := $(CORE_SRCS:%.c=$(BUILD)/obj/%.o)
PLUGIN_OBJS := $(PLUGIN_SRCS:%.c=$(BUILD)/obj/%.o)
CONF_OBJS   := $(CONF_SRCS:%.c=$(BUILD)/obj/%.o)

CORE_LIB    := $(BUILD)/librail-core.a
PINGPONG    := $(BUILD)/test/perf/pingpong
PLUGIN      := $(BUILD)/libnccl-net-rail.so
TOOLS       := $(patsubst tools/%.c,$(BUILD)/%,$(subst _,-,$(TOOL_SRCS)))
UNIT_TESTS  := $(UNIT_SRCS:test/unit/%.c=$(BUILD)/test/unit/%)
CONFORMANCE := $(BUILD)/rail-conformance
FAKEVERBS   := $(BUILD)/test/fakeverbs/libfakeverbs.so
FAKEMLX5    := $(BUILD)/test/fakeverbs/libfakemlx5.so $(BUILD)/test/fakeverbs/libfakemlx5old.so
FAKECUDA    := $(BUILD)/test/fakecuda/libfakecuda.so
FUZZ_TARGETS := $(FUZZ_SRCS:test/fuzz/%.c=$(BUILD)/test/fuzz/%)
SCALE       := $(SCALE_SRCS:test/scale/%.c=$(BUILD)/test/scale/%)
STACKDUMP   := $(BUILD)/test/nccl/stackdump.so

.PHONY: all plugin tools tests check test test-build test-netns-smoke test-instr test-unit test-fosearch test-conformance test-abi test-sanitizers \
	test-clang test-rxe test-rxe-smoke test-unit-smoke test-rxe2 test-rxe2-watchdog test-rxe2-failover test-tsan test-readme test-netns test-fresh \
	test-packages install uninstall clean readme deb rpm version test-fakeverbs test-scale fuzz \
	fuzz-targets fuzz-seeds
all: plugin tools

plugin: $(PLUGIN)
tools: $(TOOLS)
tests: $(UNIT_TESTS) $(if $(CONF_SRCS),$(CONFORMANCE)) $(FAKEVERBS) $(FAKEMLX5) $(FAKECUDA) \
	$(PINGPONG) $(SCALE) $(STACKDUMP)

# Every object depends on VERSION: the number is compiled in (src/rail.h).
$(BUILD)/obj/%.o: %.c VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(OBJ_LTO) -MMD -MP -c $< -o $@

$(CORE_LIB): $(CORE_OBJS)
	@rm -f $@
	$(Q)$(AR) rcs $@ $^

$(PLUGIN): $(PLUGIN_OBJS) $(CORE_LIB) plugin/exports.map
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(CFLAGS) $(LD_LTO) $(LDFLAGS) -Wl,--version-script=plugin/exports.map \
		-Wl,-z,defs -o $@ $(PLUGIN_OBJS) $(CORE_LIB) $(LDLIBS)

# tools/rail_info.c -> build/rail-info; a tool may keep more of its sources
# in tools/<name>/ (tools/rail_bench/*.c go into build/rail-bench).
.SECONDEXPANSION:
$(TOOLS): $(BUILD)/%: $$(subst -,_,tools/%.c) $$(wildcard $$(subst -,_,tools/%)/*.c) \
		$$(wildcard $$(subst -,_,tools/%)/*.h) $(CORE_LIB) VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) -Itools $(CFLAGS) $(LD_LTO) $(LDFLAGS) -o $@ $(filter %.c,$^) \
		$(CORE_LIB) $(LDLIBS)

# test/perf/pingpong.c: the verbs data path counted in instructions (test/perf/instr.sh).
$(PINGPONG): test/perf/pingpong.c $(CORE_LIB) VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LD_LTO) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

# test/nccl/stackdump.c: every thread's stack of a hung rank, on demand (preloaded).
$(STACKDUMP): test/nccl/stackdump.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(CFLAGS) $(LDFLAGS) -o $@ $< -lpthread

# test/scale/*.c: what many connections cost a process, TCP and the fake provider
# (scale_bench: descriptors, threads, memory, pinned bytes, setup time, idle CPU).
$(SCALE): $(BUILD)/test/scale/%: test/scale/%.c test/fakeverbs/fv_confs.h $(CORE_LIB) VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LD_LTO) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

$(BUILD)/test/unit/%: test/unit/%.c $(CORE_LIB) VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(NO_LTO) $(LDFLAGS) -MMD -MP -o $@ $< $(CORE_LIB) -lcmocka \
		$(LDLIBS)

# The fake libibverbs: exports only the ibv_* calls, at rdma-core's symbol
# versions (test/fakeverbs/fakeverbs.map), hence default visibility.
$(FAKEVERBS): $(FAKEVERBS_SRCS) test/fakeverbs/fv.h test/fakeverbs/fakeverbs.map VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fvisibility=default $(LDFLAGS) -shared \
		-Wl,--version-script=test/fakeverbs/fakeverbs.map -Wl,-soname,libfakeverbs.so \
		-Wl,-z,defs -o $@ $(FAKEVERBS_SRCS) $(LDLIBS)

# The fake libmlx5 (mlx5dv_* for Data Direct, test/fakeverbs/mlx5/): it
# works on the fake's devices, so it needs libfakeverbs.so (found beside it,
# or the copy NCCL_IBVERBS_LIB already loaded: same soname).
# A libmlx5 from before rdma-core 54: registers itself with libibverbs, no Data Direct calls.
$(BUILD)/test/fakeverbs/libfakemlx5old.so: test/fakeverbs/mlx5/fv_mlx5_old.c test/fakeverbs/fv.h \
		$(FAKEVERBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -shared -Wl,-z,defs -Wl,-rpath,'$$ORIGIN' \
		-o $@ test/fakeverbs/mlx5/fv_mlx5_old.c $(FAKEVERBS) $(LDLIBS)

$(BUILD)/test/fakeverbs/libfakemlx5.so: test/fakeverbs/mlx5/fv_mlx5.c test/fakeverbs/mlx5/fakemlx5.map \
		test/fakeverbs/fv.h $(FAKEVERBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fvisibility=default $(LDFLAGS) -shared \
		-Wl,--version-script=test/fakeverbs/mlx5/fakemlx5.map -Wl,-z,defs \
		-Wl,-rpath,'$$ORIGIN' -o $@ test/fakeverbs/mlx5/fv_mlx5.c $(FAKEVERBS) $(LDLIBS)

# The fake CUDA driver (test/fakecuda/): the driver entries of src/cuda.h
# and the tests' hooks, exported by default visibility; no plugin code.
$(FAKECUDA): $(FAKECUDA_SRCS) test/fakecuda/fakecuda.h VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,libfakecuda.so \
		-Wl,-z,defs -o $@ $(FAKECUDA_SRCS) $(LDLIBS)

$(CONFORMANCE): $(CONF_OBJS)
	$(CC) $(NO_LTO) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# libFuzzer targets: build with `make fuzz` (clang, its own tree build-fuzz,
# the core library instrumented with -fsanitize=fuzzer-no-link).
$(BUILD)/test/fuzz/fuzz_%: test/fuzz/fuzz_%.c $(CORE_LIB) VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer $(LDFLAGS) -MMD -MP -o $@ $< \
		$(CORE_LIB) $(LDLIBS)

$(BUILD)/test/fuzz/make-seeds: test/fuzz/make_seeds.c $(CORE_LIB) VERSION
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(NO_LTO) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

fuzz-targets: $(FUZZ_TARGETS)

-include $(shell find $(BUILD)/obj $(BUILD)/test -name '*.d' -type f 2>/dev/null)

# ---- tests ---------------------------------------------------------------

# Some unit tests also run the rail-info binary and load the plugin through
# it (they skip, saying why, without them). The fake-verbs tests find the
# fake library through RAIL_FAKEVERBS_LIB.
# The failover search (test_ib_fosearch, 1-3 minutes) runs last: a failing
# seed then hides no other test's result.
UNIT_ORDER  = $(filter-out %/test_ib_fosearch,$(UNIT_TESTS)) $(filter %/test_ib_fosearch,$(UNIT_TESTS))
test-unit: $(UNIT_TESTS) $(BUILD)/rail-info $(PLUGIN) $(FAKEVERBS) $(FAKEMLX5) $(FAKECUDA)
	@set -e; for t in $(UNIT_ORDER); do echo "== $$t"; \
		RAIL_FAKEVERBS_LIB=$(abspath $(FAKEVERBS)) RAIL_FAKECUDA_LIB=$(abspath $(FAKECUDA)) \
		$$t; done

# A few unit tests that need what the machine provides (cmocka, sockets,
# libibverbs' headers with the fake provider, sysfs, rlimits): the fresh
# root runs these (test/fresh/run.sh); the code's own tests run on the host.
UNIT_SMOKE = test_param test_sock test_tcp test_ib_fake test_sysfs test_fdlimit
test-unit-smoke: $(UNIT_TESTS) $(FAKEVERBS) $(FAKEMLX5)
	@set -e; for t in $(UNIT_SMOKE); do echo "== $$t"; \
		RAIL_FAKEVERBS_LIB=$(abspath $(FAKEVERBS)) $(BUILD)/test/unit/$$t; done

# The seeded randomized failover search alone (test/unit/test_ib_fosearch.c,
# which test-unit also runs: 2000 seeds, 300 under ASan, 100 under TSan).
# FOSEARCH_SEEDS, FOSEARCH_BASE, FOSEARCH_JOBS (2) to change the run,
# FOSEARCH_DUMP=DIR to keep each failing seed's output (DIR/seed-N.log); a seed
# replays alone with `test_ib_fosearch --seed N`.
test-fosearch: $(BUILD)/test/unit/test_ib_fosearch $(FAKEVERBS) $(FAKEMLX5)
	RAIL_FAKEVERBS_LIB=$(abspath $(FAKEVERBS)) $(BUILD)/test/unit/test_ib_fosearch

# The live verbs unit tests on the fake provider, per description in
# test/fakeverbs/conf/ (no RDMA device needed).
test-fakeverbs: $(UNIT_TESTS) $(FAKEVERBS) $(FAKEMLX5)
	test/fakeverbs/run-live.sh $(BUILD)

# 128 pairs over TCP and over the fake provider, each metric against its
# bound in test/scale/limits (test/scale/check.sh; about 15 s).
test-scale: $(SCALE) $(FAKEVERBS)
	test/scale/check.sh $(BUILD)

# Every libFuzzer target for FUZZ_TIME seconds (default 20) from its seed
# corpus (test/fuzz/corpus/), ASan and UBSan on; a crash fails (test/fuzz/run.sh).
FUZZ_TIME  ?= 20
FUZZ_BUILD ?= build-fuzz
FUZZ_MAKE   = $(MAKE) BUILD=$(FUZZ_BUILD) CC=clang SAN=address,undefined,fuzzer-no-link OPT=-O1
fuzz:
	+$(FUZZ_MAKE) -j$(JOBS) fuzz-targets
	test/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_TIME)

# Regenerate the seed corpus with the real encoders (after a wire format change).
fuzz-seeds:
	+$(FUZZ_MAKE) $(FUZZ_BUILD)/test/fuzz/make-seeds
	$(FUZZ_BUILD)/test/fuzz/make-seeds test/fuzz/corpus

test-abi: $(PLUGIN)
	test/check-exports.sh $(PLUGIN)

# The suite, then its self-test: every scenario run against an injected
# fault must fail, which shows each one can.
test-conformance: $(PLUGIN) $(CONFORMANCE)
	NCCL_RAIL_TRANSPORT=tcp $(CONFORMANCE) --plugin $(PLUGIN)
	NCCL_RAIL_TRANSPORT=tcp $(CONFORMANCE) --plugin $(PLUGIN) --self-test

# rail-bench --server / --client in two network namespaces joined by a veth
# pair (and its --csv), then rail-check across two namespaces with two rails,
# healthy and with a rail down or black-holed, whose --svg heatmap headless
# chromium draws (root; skips saying why otherwise, chromium included).
test-netns: all
	test/netns/run.sh $(BUILD)
	test/netns/rail-check.sh $(BUILD)
	test/netns/failover.sh $(BUILD)

# The first of them only (network namespaces, veth, rail-bench between them):
# what the fresh root checks of the machine's iproute2 (test/fresh/run.sh).
test-netns-smoke: all
	test/netns/run.sh $(BUILD)

# The unit tests and the conformance suite under AddressSanitizer (leaks
# included) and UndefinedBehaviorSanitizer, in their own build tree.
test-sanitizers:
	$(MAKE) -j$(JOBS) BUILD=build-san SAN=address,undefined OPT=-O1 plugin tests build-san/rail-info
	$(MAKE) BUILD=build-san SAN=address,undefined OPT=-O1 test-unit test-fakeverbs
	ASAN_OPTIONS=detect_leaks=1 NCCL_RAIL_TRANSPORT=tcp \
		build-san/rail-conformance --plugin build-san/libnccl-net-rail.so --max-size 64M

# The plugin and the suite under ThreadSanitizer (build-tsan/): an injected
# data race must be reported first (so this check can fail), then the unit
# tests (the verbs transport on the fake provider included) and the TCP
# conformance suite (messages up to 16M: larger ones take the same paths in
# more chunks, and TSan's copies are slow) must pass with no report. The suite
# runs on the newest ABI only: the shims convert structs on NCCL's thread and
# share every thread and lock of the core (make test-conformance runs every
# ABI without TSan, make test-sanitizers under ASan), and under TSan each ABI
# costs 90-160 s on 2 cores.
# Suppressions, each with its reason: test/tsan.supp.
TSAN_RUN = NCCL_RAIL_TRANSPORT=tcp TSAN_OPTIONS="suppressions=$(abspath test/tsan.supp) \
	second_deadlock_stack=1 $(TSAN_OPTIONS)" build-tsan/rail-conformance \
	--plugin build-tsan/libnccl-net-rail.so
test-tsan:
	$(MAKE) -j$(JOBS) BUILD=build-tsan SAN=thread OPT=-O1 plugin tests build-tsan/rail-info
	@if $(TSAN_RUN) --abi 12 --scenario properties --inject data-race >build-tsan/inject.log 2>&1 \
		|| ! grep -q 'ThreadSanitizer: data race' build-tsan/inject.log; then \
		cat build-tsan/inject.log; \
		echo "test-tsan: the injected data race was not reported: ThreadSanitizer is not active"; \
		exit 1; fi; echo "test-tsan: the injected data race was reported (the check works)"
	TSAN_OPTIONS="suppressions=$(abspath test/tsan.supp) $(TSAN_OPTIONS)" \
		$(MAKE) BUILD=build-tsan SAN=thread OPT=-O1 test-unit test-fakeverbs
	$(TSAN_RUN) --abi 12 --max-size 16M

# Everything must also build warning-free with clang.
test-clang:
	$(MAKE) -j$(JOBS) BUILD=build-clang CC=clang all tests

test-readme: $(BUILD)/rail-info
	test/check-readme.sh $(BUILD)/rail-info

# src/ib/, src/tcp/ and src/rma/ call one way, down their layers: the tables
# in src/ib/ib.h, src/tcp/tcp.h and src/rma/rma_tcp.h against nm of the objects
# (test/check-layering.sh).
.PHONY: test-layering
test-layering: $(CORE_LIB)
	$(Q)test/check-layering.sh $(filter $(BUILD)/obj/src/ib/%,$(CORE_OBJS))
	$(Q)test/check-layering.sh -t src/tcp/tcp.h $(filter $(BUILD)/obj/src/tcp/%,$(CORE_OBJS))
	$(Q)test/check-layering.sh -t src/rma/rma_tcp.h $(filter $(BUILD)/obj/src/rma/%,$(CORE_OBJS))

# The verbs tests in a Soft-RoCE guest (test/rxe/), with the live verbs unit
# test also built under the sanitizers; then a second boot with the bridge
# topology (four rxe devices, one of which can fail alone) for the failover tests:
# the harness (16) and comms moving between devices with every byte checked (17).
test-rxe: all tests
	$(MAKE) -j$(JOBS) BUILD=build-san SAN=address,undefined OPT=-O1 build-san/test/unit/test_ib_live
	test/rxe/run.sh --timeout 2400
	test/rxe/run.sh --topo bridge --tests "16-ib-failover 17-ib-failover-move" --timeout 1200

# Two guests as two RDMA nodes (test/rxe2/): the conformance suite between
# them, then the peer's guest killed on each side and a link taken down.
test-rxe2: all tests
	test/rxe2/tests.sh

# Verbs failover between the two guests, three NICs each (out-of-band, rxe0,
# rxe1): the link of B's, then A's, rxe0 NIC pulled for 3 s mid-transfer; the
# comm must move to rxe1 and back with every byte checked; then B's again with
# the two rxe NIC pairs on two rails (A must follow B to rxe1). About 2.5
# minutes; not in make test (test/rxe2/tests.sh fo-link-b fo-link-a fo-rails-b).
test-rxe2-failover: all tests
	test/rxe2/tests.sh fo-link-b fo-link-a fo-rails-b

# The verbs watchdog between two guests, in make test (about 50 s): the
# sender's guest is killed mid-transfer and the receiver must fail within
# NCCL_RAIL_PEER_TIMEOUT=10 s, then the receiver's guest and the sender must
# fail and close (test/rxe2/tests.sh kill-b kill-a).
test-rxe2-watchdog: all tests
	test/rxe2/tests.sh kill-b kill-a

# One boot of the guest with its smoke test (the fresh-machine test uses it).
test-rxe-smoke: all tests
	test/rxe/run.sh --tests 00-smoke

# The README's commands in a fresh Debian 12 root (debootstrap, cached in
# /var/cache/nccl-net-rail/fresh), then the .deb installed there; the first command in
# fresh Ubuntu 22.04 and 24.04 roots (test/fresh/).
test-fresh: deb
	test/fresh/run.sh

# The packages build, and the .deb holds what it must (test/packaging.sh).
test-packages: deb
	test/check-packages.sh $(BUILD)/pkg

check: all tests test-unit test-fakeverbs test-abi test-readme test-layering test-conformance \
	test-netns test-scale

# Parallel jobs for the sanitizer, clang and fuzz builds inside the test targets.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# make test runs its steps one after another and prints each one's time
# (test/run-steps.sh); like make -k, a failed step does not stop the rest.
TEST_STEPS = test-build test-unit test-fakeverbs test-scale test-abi test-readme test-layering \
	test-conformance test-netns test-sanitizers test-tsan test-clang fuzz test-instr \
	test-packages test-fresh test-rxe test-rxe2-watchdog
test-build:
	$(MAKE) -j$(JOBS) all tests
test:
	@test/run-steps.sh "$(MAKE)" $(TEST_STEPS)

# Instructions per small message on the verbs data path against
# test/perf/instr-limits (callgrind on the fake provider; skipped, saying so,
# without valgrind).
test-instr: $(PINGPONG) $(FAKEVERBS)
	test/perf/instr.sh --check

readme: $(BUILD)/rail-info
	test/check-readme.sh $(BUILD)/rail-info --update

version:
	@echo $(VERSION)

# ---- install -------------------------------------------------------------

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(DOCDIR)
	install -m 0755 $(PLUGIN) $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(TOOLS) $(DESTDIR)$(BINDIR)/
	install -m 0644 README.md LICENSE CHANGELOG.md nccl-net.conf.example $(DESTDIR)$(DOCDIR)/
	install -m 0644 docs/*.md $(DESTDIR)$(DOCDIR)/
ifeq ($(NCCL_DEFAULT_LINK),1)
	ln -sf libnccl-net-rail.so $(DESTDIR)$(LIBDIR)/libnccl-net.so
endif
	@if [ -z "$(DESTDIR)" ] && command -v ldconfig >/dev/null && [ "$$(id -u)" = 0 ]; then \
		ldconfig; \
	fi
	@echo "installed $(DESTDIR)$(LIBDIR)/libnccl-net-rail.so; NCCL finds it by name when"
	@echo "$(LIBDIR) is on the loader's path (docs/DEPLOY.md): else set"
	@echo "NCCL_NET_PLUGIN=$(LIBDIR)/libnccl-net-rail.so (NCCL 2.21+) or LD_LIBRARY_PATH."

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libnccl-net-rail.so
	@if [ -L $(DESTDIR)$(LIBDIR)/libnccl-net.so ] && \
	    [ "$$(readlink $(DESTDIR)$(LIBDIR)/libnccl-net.so)" = libnccl-net-rail.so ]; then \
		echo "rm -f $(DESTDIR)$(LIBDIR)/libnccl-net.so"; rm -f $(DESTDIR)$(LIBDIR)/libnccl-net.so; \
	fi
	rm -f $(patsubst $(BUILD)/%,$(DESTDIR)$(BINDIR)/%,$(TOOLS))
	rm -rf $(DESTDIR)$(DOCDIR)

# ---- packages ------------------------------------------------------------

deb: all
	packaging/make-deb.sh $(BUILD) $(VERSION)

rpm:
	packaging/make-rpm.sh $(BUILD) $(VERSION)

clean:
	rm -rf $(BUILD)/obj $(BUILD)/test $(BUILD)/pkg $(BUILD)/*.a $(BUILD)/*.so $(TOOLS) \
		$(CONFORMANCE) build-san build-clang build-fuzz
