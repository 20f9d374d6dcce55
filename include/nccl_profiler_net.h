/*
 * nccl-net-rail: what a net plugin hands NCCL's profiler (net ABI v10+).
 *
 * Written for this project from the interface facts of NCCL's profiler
 * ABI. NCCL gives the plugin a callback at init (ncclProfilerCallback_t,
 * nccl_common.h) and a parent handle per isend (one per buffer of an
 * irecv). The plugin starts an event with
 *     cb(&ev, NCCL_PROFILER_NET_EVENT_START, parent, plugin_id, &descr)
 * and ends it with
 *     cb(&ev, NCCL_PROFILER_NET_EVENT_STOP, NULL, 0, NULL).
 * plugin_id says which descriptor layout descr points at: a type in the
 * high bits and the layout's version in the low 16. NCCL copies nothing
 * itself: the profiler reads descr during the start call only.
 */
#ifndef RAIL_NCCL_PROFILER_NET_H
#define RAIL_NCCL_PROFILER_NET_H

#include <stddef.h>
#include <stdint.h>

/* The callback's second argument. */
#define NCCL_PROFILER_NET_EVENT_START 0
#define NCCL_PROFILER_NET_EVENT_STOP 1
#define NCCL_PROFILER_NET_EVENT_UPDATE 2
#define NCCL_PROFILER_NET_EVENT_UPDATE_STOP 3

/* The profiler's event type for plugin events (its activation mask bit). */
#define NCCL_PROFILE_NET_PLUGIN_EVENT (1 << 7)

/* plugin_id = type | version. */
#define NCCL_PROFILER_NET_VER_BITS 16
#define NCCL_PROFILER_NET_TYPE_IB (1u << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_SOCK (2u << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_IB_VER 1
#define NCCL_PROFILER_NET_SOCKET_VER 1

/* Verbs, layout 1: one event per work request. type = NCCL_PROFILE_QP. */
#define NCCL_PROFILE_QP 1
typedef struct {
	uint8_t type;
	union {
		struct {
			int device;	/* the member device of the (virtual) NIC */
			uint64_t wr_id;
			int opcode;	/* enum ibv_wr_opcode of the work request */
			int qpNum;
			size_t length;	/* bytes the work request moves */
		} qp;
	};
} ncclProfilerNetIbDescr_v1_t;

/* Sockets, layout 1: one event per socket operation. type = NCCL_PROFILE_SOCKET. */
#define NCCL_PROFILE_SOCKET 1
#define NCCL_PROFILER_SOCK_OP_SEND 0
#define NCCL_PROFILER_SOCK_OP_RECV 1
typedef struct {
	uint8_t type;
	union {
		struct {
			int fd;
			int op;		/* NCCL_PROFILER_SOCK_OP_* */
			size_t length;
		} sock;
	};
} ncclProfilerNetSockDescr_v1_t;

#endif
