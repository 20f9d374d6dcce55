/*
 * nccl-net-rail: what rail-info prints about the verbs side: every device
 * and port (link layer, state, speed, MTU), each GID table with the chosen
 * GID and the reason, and the GPU-memory ladder (DMA-BUF, peermem, host)
 * with the result of each check. It uses the same functions the transport
 * uses for its decisions.
 */
#ifndef RAIL_IB_REPORT_H
#define RAIL_IB_REPORT_H

#include <stdio.h>

/* Text for humans, or one JSON value (an object) when json is set. */
void rail_ib_report(FILE *out, int json);

#endif
