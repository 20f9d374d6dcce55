/*
 * nccl-net-rail: which GPU this process drives, without linking CUDA.
 * NCCL makes its device current before it initialises the plugin; if the
 * CUDA driver library is already loaded we ask it for that device's PCI
 * address.
 */
#ifndef RAIL_GPU_H
#define RAIL_GPU_H

#include <stddef.h>

/* "0000:1b:00.0" (lower case); -ENOENT without a loaded driver or context. */
int rail_current_gpu_bdf(char *bdf, size_t len);

#endif
