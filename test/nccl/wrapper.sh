#!/bin/bash
# Per-rank environment for NCCL "nodes" on one machine: ranks are grouped
# RAIL_TEST_RANKS_PER_NODE to a node (distinct NCCL_HOSTID per node), and
# each rank of a node takes the next of RAIL_TEST_NGPUS GPUs.
rpn=${RAIL_TEST_RANKS_PER_NODE:-1}
ngpu=${RAIL_TEST_NGPUS:-1}
rank=${OMPI_COMM_WORLD_RANK:?run me under mpirun}
export NCCL_HOSTID=railnode$((rank / rpn))
export RAIL_TEST_GPU=$(((rank % rpn) % ngpu))
exec "$@"
