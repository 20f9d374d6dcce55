#!/bin/bash
# Per-rank environment for NCCL "nodes" on one machine: ranks are grouped
# RAIL_TEST_RANKS_PER_NODE to a node (distinct NCCL_HOSTID per node), and
# each rank of a node takes the next of RAIL_TEST_NGPUS GPUs.
rpn=${RAIL_TEST_RANKS_PER_NODE:-1}
ngpu=${RAIL_TEST_NGPUS:-1}
rank=${OMPI_COMM_WORLD_RANK:?run me under mpirun}
export NCCL_HOSTID=railnode$((rank / rpn))
export RAIL_TEST_GPU=$(((rank % rpn) % ngpu))
# nccl-tests never ends with a smallest size of 0: its warm-up doubles the
# size from -b up to -e (0 stays 0), as does a -f step. It looks like a hang
# of the transport (the header printed, then nothing), so refuse it.
prev=
for a in "$@"; do
	case "$prev $a" in
	"-b 0" | "--minbytes 0" | "-b 0"[BKMG] | "--minbytes 0"[BKMG])
		echo "wrapper.sh: $1 with $prev $a never ends (nccl-tests' size loop doubles 0);" \
			"start at -b 8" >&2
		exit 2 ;;
	esac
	prev=$a
done
exec "$@"
