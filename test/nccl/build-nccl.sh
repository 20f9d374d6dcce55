#!/bin/bash
# Build an NCCL release from a source tarball on the GPU machine (it has no
# network: carry the tarball), for runs against another NCCL than the
# installed one: RUN_NCCL_LIB=BUILDDIR/lib test/nccl/run.sh ...
#   test/nccl/build-nccl.sh SRC.tgz BUILDDIR     (about 3.5 min on 16 cores, sm_90 only)
set -euo pipefail
src=${1:?usage: build-nccl.sh SRC.tgz BUILDDIR} out=${2:?usage: build-nccl.sh SRC.tgz BUILDDIR}
if [ -e "$out/lib/libnccl.so" ]; then echo "build-nccl: $out already built"; exit 0; fi
tree=$(mktemp -d /tmp/nccl-src.XXXXXX)
tar -xzf "$src" -C "$tree"
make -C "$tree" -j"$(nproc)" src.build BUILDDIR="$out" \
	NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$out.build.log" 2>&1 ||
	{ tail -30 "$out.build.log"; exit 1; }
ls -l "$out"/lib/libnccl.so*
