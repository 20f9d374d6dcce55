#!/usr/bin/env python3
"""PyTorch check: two processes on one GPU as two NCCL "nodes" (distinct
NCCL_HOSTID), torch.distributed with the NCCL backend through the plugin.
Each rank all-reduces tensors of several sizes and checks the exact sum.

    NCCL_NET_PLUGIN=$PWD/build/libnccl-net-rail.so NCCL_NET=Rail \
        python3 test/nccl/torch_allreduce.py [--port 29512]
Exits non-zero if any element is wrong or a rank fails.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, port, sizes, result):
    os.environ["NCCL_HOSTID"] = f"torchnode{rank}"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    wrong = 0
    for n in sizes:
        t = torch.arange(n, device="cuda", dtype=torch.float32) % 7 + (rank + 1)
        dist.all_reduce(t)
        expect = (torch.arange(n, device="cuda", dtype=torch.float32) % 7) * world \
            + world * (world + 1) / 2
        wrong += int((t != expect).sum().item())
    torch.cuda.synchronize()
    dist.destroy_process_group()
    result[rank] = wrong


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=29512)
    args = ap.parse_args()
    sizes = [1, 2, 1000, 1 << 20, 1 << 26]
    result = mp.Manager().list([-1, -1])
    mp.spawn(rank_main, args=(2, args.port, sizes, result), nprocs=2, join=True)
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}: "
          f"wrong elements per rank {list(result)} over sizes {sizes}")
    sys.exit(0 if list(result) == [0, 0] else 1)


if __name__ == "__main__":
    main()
