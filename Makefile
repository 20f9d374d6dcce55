# nccl-net-rail build. `make` builds the plugin, the tools and the tests;
# `make test` runs every suite; `make install PREFIX=...` installs.
#
# One static core library (build/librail-core.a) links into the plugin,
# the tools and the tests. Sources are found by directory, so new files
# need no Makefile change:
#   src/*.c src/*/*.c      -> core library
#   plugin/*.c             -> the plugin's ABI shims
#   tools/<name>.c         -> build/<name> (underscores become dashes)
#   test/unit/test_*.c     -> build/test/unit/test_* (cmocka)

CC      ?= gcc
BUILD   ?= build
PREFIX  ?= /usr/local
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
CPPFLAGS += -D_GNU_SOURCE -Iinclude -Isrc
CFLAGS  += -std=c11 $(OPT) -g -fPIC -fvisibility=hidden $(WARN) -pthread
LDLIBS  += -ldl -pthread
ifneq ($(SAN),)
CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SAN)
endif

CORE_SRCS   := $(sort $(wildcard src/*.c src/*/*.c))
PLUGIN_SRCS := $(sort $(wildcard plugin/*.c))
TOOL_SRCS   := $(sort $(wildcard tools/*.c))
UNIT_SRCS   := $(sort $(wildcard test/unit/test_*.c))
CONF_SRCS   := $(sort $(wildcard test/conformance/*.c))

CORE_OBJS   := $(CORE_SRCS:%.c=$(BUILD)/obj/%.o)
PLUGIN_OBJS := $(PLUGIN_SRCS:%.c=$(BUILD)/obj/%.o)
CONF_OBJS   := $(CONF_SRCS:%.c=$(BUILD)/obj/%.o)

CORE_LIB    := $(BUILD)/librail-core.a
PLUGIN      := $(BUILD)/libnccl-net-rail.so
TOOLS       := $(patsubst tools/%.c,$(BUILD)/%,$(subst _,-,$(TOOL_SRCS)))
UNIT_TESTS  := $(UNIT_SRCS:test/unit/%.c=$(BUILD)/test/unit/%)
CONFORMANCE := $(BUILD)/rail-conformance

.PHONY: all plugin tools tests test test-unit test-conformance test-abi test-sanitizers \
	test-clang test-rxe test-readme install clean readme
all: plugin tools tests

plugin: $(PLUGIN)
tools: $(TOOLS)
tests: $(UNIT_TESTS) $(if $(CONF_SRCS),$(CONFORMANCE))

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(CORE_LIB): $(CORE_OBJS)
	@rm -f $@
	$(Q)$(AR) rcs $@ $^

$(PLUGIN): $(PLUGIN_OBJS) $(CORE_LIB) plugin/exports.map
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(LDFLAGS) -Wl,--version-script=plugin/exports.map -Wl,-z,defs \
		-o $@ $(PLUGIN_OBJS) $(CORE_LIB) $(LDLIBS)

# tools/rail_info.c -> build/rail-info
.SECONDEXPANSION:
$(TOOLS): $(BUILD)/%: $$(subst -,_,tools/%.c) $(CORE_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

$(BUILD)/test/unit/%: test/unit/%.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -MMD -MP -o $@ $< $(CORE_LIB) -lcmocka $(LDLIBS)

$(CONFORMANCE): $(CONF_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

-include $(shell find $(BUILD) -name '*.d' -type f 2>/dev/null)

# ---- tests ---------------------------------------------------------------

# Some unit tests also check the rail-info binary (they skip, saying why, without it).
test-unit: $(UNIT_TESTS) $(BUILD)/rail-info
	@set -e; for t in $(UNIT_TESTS); do echo "== $$t"; $$t; done

test-abi: $(PLUGIN)
	test/check-exports.sh $(PLUGIN)

# The suite, then its self-test: every scenario run against an injected
# fault must fail, which shows each one can.
test-conformance: $(PLUGIN) $(CONFORMANCE)
	NCCL_RAIL_TRANSPORT=tcp $(CONFORMANCE) --plugin $(PLUGIN)
	NCCL_RAIL_TRANSPORT=tcp $(CONFORMANCE) --plugin $(PLUGIN) --self-test

# The conformance suite under AddressSanitizer and UBSan, in its own tree.
# The unit tests and the conformance suite under AddressSanitizer (leaks
# included) and UndefinedBehaviorSanitizer, in their own build tree.
test-sanitizers:
	$(MAKE) BUILD=build-san SAN=address,undefined OPT=-O1 plugin tests build-san/rail-info
	$(MAKE) BUILD=build-san SAN=address,undefined OPT=-O1 test-unit
	ASAN_OPTIONS=detect_leaks=1 NCCL_RAIL_TRANSPORT=tcp \
		build-san/rail-conformance --plugin build-san/libnccl-net-rail.so --max-size 64M

# Everything must also build warning-free with clang.
test-clang:
	$(MAKE) BUILD=build-clang CC=clang all

test-readme: $(BUILD)/rail-info
	test/check-readme.sh $(BUILD)/rail-info

# The verbs tests in a Soft-RoCE guest (test/rxe/), with the live verbs unit
# test also built under the sanitizers.
test-rxe: all
	$(MAKE) BUILD=build-san SAN=address,undefined OPT=-O1 build-san/test/unit/test_ib_live
	test/rxe/run.sh

test: all test-unit test-abi test-readme test-conformance test-sanitizers test-clang test-rxe

readme: $(BUILD)/rail-info
	test/check-readme.sh $(BUILD)/rail-info --update

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(PLUGIN) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf build build-san build-clang
