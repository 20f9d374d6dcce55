/*
 * nccl-net-rail: the version, readable from the .so file itself. rail-info
 * finds this "@(#)" string (the what(1) convention) in the library NCCL
 * would load and reports its version; no symbol is exported for it, so the
 * dynamic symbol table stays exactly ncclNetPlugin_v6..v12.
 */
#include "rail.h"

static const char rail_ident[] __attribute__((used)) = "@(#)nccl-net-rail " RAIL_VERSION_STRING;
