/*
 * nccl-net-rail tests: the fake CUDA driver's hooks (test/fakecuda/fakecuda.c).
 * A test loads the fake with dlopen (the same path it gives the plugin in
 * NCCL_RAIL_CUDA_LIB, so both share one copy) and looks these up by name.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

/* size bytes of "device" memory (zeroed); the plugin must never dereference it. */
typedef void *(*fcu_alloc_device_fn)(size_t size);
/* The host's view of device memory: where a test reads and writes it. */
typedef void *(*fcu_host_fn)(const void *dptr);
/* Make the fake's context current on the calling thread (NCCL's thread has its device current). */
typedef void (*fcu_make_current_fn)(void);
/* Delay each copy of every stream by us microseconds before it runs (also FAKECUDA_COPY_DELAY_US). */
typedef void (*fcu_set_delay_fn)(unsigned us);
/* on: no stream starts another operation until off (a GPU busy with other work). */
typedef void (*fcu_hold_fn)(int on);
/* n (not 0): every cuMemHostAlloc of exactly n bytes fails, out of memory; 0: none. */
typedef void (*fcu_refuse_host_alloc_fn)(size_t n);
/* How often an entry was called ("cuStreamWriteValue64_v2", ...), and calls refused
 * for want of a current context. */
typedef unsigned long (*fcu_calls_fn)(const char *name);
typedef unsigned long (*fcu_refused_fn)(void);
/*
 * A DMA-BUF of device memory: a new fd (the caller closes it) that every
 * allocation shares, with *offset the place of dptr in it; -1 if dptr is
 * not device memory. The fake verbs map such an fd (a memfd named
 * "fakecuda-device") at that offset, so data the NIC moves lands there.
 */
typedef int (*fcu_dmabuf_fn)(const void *dptr, uint64_t *offset);

#endif
