#!/bin/bash
# Build an NCCL release from a source tarball on the GPU machine (it has no
# network: carry the tarball), for runs against another NCCL than the
# installed one: RUN_NCCL_LIB=BUILDDIR/lib test/nccl/run.sh ...
#   test/nccl/build-nccl.sh SRC.tgz BUILDDIR     (about 4 min on 16 cores, sm_90 only)
# SRC.tgz: NCCL's tree at its top, or in one folder (e.g. from the NCCL
# mirror: git archive --prefix=nccl/ v2.30.7-1 | gzip > .carry/nccl-2.30.7.tgz).
set -euo pipefail
src=${1:?usage: build-nccl.sh SRC.tgz BUILDDIR} out=${2:?usage: build-nccl.sh SRC.tgz BUILDDIR}
if [ -e "$out/lib/libnccl.so" ]; then echo "build-nccl: $out already built"; exit 0; fi
tree=$(mktemp -d /tmp/nccl-src.XXXXXX)
tar -xzf "$src" -C "$tree"
# A tarball of one top folder (git archive --prefix=nccl/, GitHub's release
# tarballs): build in that folder.
top=$(find "$tree" -mindepth 1 -maxdepth 1)
if [ ! -e "$tree/Makefile" ] && [ "$(printf '%s\n' "$top" | wc -l)" = 1 ] && [ -d "$top" ]; then
	tree=$top
fi
# An NCCL's headers in CUDA's include folder (nccl.h, nccl_device/) shadow the
# tree's own nccl_device headers in NCCL 2.30's build (sym_kernels_host.cc:
# "NCCL_GIN_MAX_CONNECTIONS was not declared"): move them aside for the build.
cuda_inc=$(dirname "$(dirname "$(command -v nvcc)")")/include
if [ -e "$cuda_inc/nccl_device" ] || [ -e "$cuda_inc/nccl.h" ]; then
	echo "build-nccl: $cuda_inc holds NCCL headers, which shadow the tree's own;" \
		"if the build fails, move nccl.h, nccl_device.h and nccl_device/ aside" >&2
fi
make -C "$tree" -j"$(nproc)" src.build BUILDDIR="$out" \
	NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$out.build.log" 2>&1 ||
	{ tail -30 "$out.build.log"; exit 1; }
ls -l "$out"/lib/libnccl.so*
