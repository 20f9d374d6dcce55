/*
 * nccl-net-rail: the handles NCCL holds (contexts, comms, memory
 * registrations, requests) are numbers, never pointers, so that a handle
 * used after it died (a second close, test after close, deregMr after
 * close, a second finalize) is recognised without touching freed memory.
 *
 * A table (one per kind of object) is an array of slots in segments of
 * 4096 that are allocated on demand and never freed while a slot is in use
 * (at the last finalize, when every table is empty, they are). A slot has
 * a 32-bit generation, odd while in use; freeing it makes it even, reusing
 * it odd again, so an old handle never matches the slot's new occupant.
 *
 *   table handle:   tag u8 | generation u32 | slot index u24
 *   request handle: tag u8 | stamp u27 | request index u9 | comm slot u20
 *
 * A request handle names the slot of its comm (whose request pool lives as
 * long as the comm) and an element of that pool; the element's stamp, set
 * when the request is handed out, must match. The tag byte makes every
 * handle a non-canonical address: a caller that dereferences one faults
 * at once instead of reading someone's memory.
 *
 * Lookups are lock-free (a few loads, no atomics beyond acquire loads);
 * allocating and freeing take one mutex. A lookup racing with the free of
 * the same handle on another thread is the caller's bug and not covered.
 */
#ifndef RAIL_HANDLES_H
#define RAIL_HANDLES_H

#include <stdatomic.h>
#include <stdint.h>

#include "rail.h"

enum rail_htab_id {
	RAIL_HT_CTX = 0,
	RAIL_HT_COMM = 1,
	RAIL_HT_MR = 2,
	RAIL_HT_COUNT
};

#define RAIL_H_TAG_CTX 0x58u	/* 'X' */
#define RAIL_H_TAG_COMM 0x43u	/* 'C' */
#define RAIL_H_TAG_MR 0x4du	/* 'M' */
#define RAIL_H_TAG_REQ 0x51u	/* 'Q' */
#define RAIL_H_TAG_RMA_REQ 0x52u	/* 'R': an RMA request (src/api_rma.c) */

#define RAIL_H_SEG_BITS 12
#define RAIL_H_SEG_SLOTS (1u << RAIL_H_SEG_BITS)
#define RAIL_H_MAX_SEGS 4096u	/* 2^24 slots at most per table */
#define RAIL_H_IDX_BITS 24
#define RAIL_H_COMM_BITS 20	/* comms: 2^20 slots at most (request handles) */
#define RAIL_H_REQ_BITS 9	/* requests per comm: 512 at most */
#define RAIL_H_STAMP_BITS 27
#define RAIL_H_STAMP_MASK ((1u << RAIL_H_STAMP_BITS) - 1)
#define RAIL_H_NONE UINT32_MAX

struct rail_slot {
	_Atomic uint32_t gen;	/* odd: in use */
	uint32_t kind;		/* what obj is (enum rail_comm_kind, ...) */
	void *obj;
	uint32_t next;		/* free list; or the next registration of the same owner */
	uint32_t prev;		/* the previous registration of the same owner */
	uint32_t owner;		/* a registration: its comm's slot */
	uint32_t owned;		/* a comm: its first registration (RAIL_H_NONE: none) */
};

struct rail_htab {
	uint8_t tag;
	uint32_t max_slots;
	struct rail_slot *_Atomic segs[RAIL_H_MAX_SEGS];
};

extern struct rail_htab rail_htabs[RAIL_HT_COUNT];

/* The slot of index idx if its segment exists (no liveness check). */
static inline struct rail_slot *rail_h_slot(const struct rail_htab *t, uint32_t idx)
{
	struct rail_slot *seg;

	if (rail_unlikely(idx >= t->max_slots))
		return NULL;
	seg = atomic_load_explicit(&t->segs[idx >> RAIL_H_SEG_BITS], memory_order_acquire);
	return seg ? &seg[idx & (RAIL_H_SEG_SLOTS - 1)] : NULL;
}

/* The object of a live handle of table id, and its kind; NULL if h is not one. */
static inline void *rail_h_get(enum rail_htab_id id, uintptr_t h, uint32_t *kind)
{
	const struct rail_htab *t = &rail_htabs[id];
	struct rail_slot *s;
	uint64_t v = (uint64_t)h;

	if (rail_unlikely((v >> 56) != t->tag))
		return NULL;
	s = rail_h_slot(t, (uint32_t)(v & ((1u << RAIL_H_IDX_BITS) - 1)));
	if (rail_unlikely(!s || atomic_load_explicit(&s->gen, memory_order_acquire) !=
				      (uint32_t)(v >> RAIL_H_IDX_BITS)))
		return NULL;
	*kind = s->kind;
	return s->obj;
}

/* The object in a live slot by index (request handles), NULL if the slot is free. */
static inline void *rail_h_get_idx(enum rail_htab_id id, uint32_t idx, uint32_t *kind)
{
	struct rail_slot *s = rail_h_slot(&rail_htabs[id], idx);

	if (rail_unlikely(!s || !(atomic_load_explicit(&s->gen, memory_order_acquire) & 1)))
		return NULL;
	*kind = s->kind;
	return s->obj;
}

static inline uintptr_t rail_h_req_encode(uint32_t comm_idx, uint32_t req_idx, uint32_t stamp)
{
	return (uintptr_t)((uint64_t)RAIL_H_TAG_REQ << 56 |
			   (uint64_t)(stamp & RAIL_H_STAMP_MASK) << (RAIL_H_REQ_BITS + RAIL_H_COMM_BITS) |
			   (uint64_t)req_idx << RAIL_H_COMM_BITS | comm_idx);
}

/* Split a request handle; 0 if h is not one. */
static inline int rail_h_req_decode(uintptr_t h, uint32_t *comm_idx, uint32_t *req_idx,
				    uint32_t *stamp)
{
	uint64_t v = (uint64_t)h;

	if (rail_unlikely((v >> 56) != RAIL_H_TAG_REQ))
		return 0;
	*comm_idx = (uint32_t)(v & ((1u << RAIL_H_COMM_BITS) - 1));
	*req_idx = (uint32_t)(v >> RAIL_H_COMM_BITS) & ((1u << RAIL_H_REQ_BITS) - 1);
	*stamp = (uint32_t)(v >> (RAIL_H_COMM_BITS + RAIL_H_REQ_BITS)) & RAIL_H_STAMP_MASK;
	return 1;
}

/*
 * A new handle for obj. owner: for a registration, the comm handle it
 * belongs to (linked into that comm's list), else 0. -ENOSPC when the table
 * is full, -ENOMEM. *idx (may be NULL) gets the slot index.
 */
int rail_h_alloc(enum rail_htab_id id, uint32_t kind, void *obj, uintptr_t owner, uintptr_t *h,
		 uint32_t *idx);
/*
 * Free a live handle and return its object and kind (one caller wins a
 * race between two frees). -EINVAL if h is not a live handle of the table.
 */
int rail_h_free(enum rail_htab_id id, uintptr_t h, void **obj, uint32_t *kind);
/* The slot index of a handle (no check). */
static inline uint32_t rail_h_index(uintptr_t h)
{
	return (uint32_t)((uint64_t)h & ((1u << RAIL_H_IDX_BITS) - 1));
}
/*
 * Free one registration still owned by the comm handle comm (closing it):
 * 1 and its object, 0 when none is left.
 */
int rail_h_take_owned(uintptr_t comm, void **obj);
/* The registration's owner slot == the comm's slot. */
int rail_h_owned_by(uintptr_t mr, uintptr_t comm);
/* Slots in use in a table. */
uint32_t rail_h_live(enum rail_htab_id id);
/* When no slot of any table is in use: free every segment (last finalize). */
void rail_h_release_if_empty(void);

#endif
