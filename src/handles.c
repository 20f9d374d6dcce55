/* nccl-net-rail: handle tables (see handles.h). */
#include <pthread.h>
#include <stdlib.h>

#include "handles.h"

_Static_assert(sizeof(uintptr_t) == 8, "handles are 64-bit numbers");
_Static_assert(RAIL_H_COMM_BITS + RAIL_H_REQ_BITS + RAIL_H_STAMP_BITS == 56,
	       "a request handle is a tag byte and 56 bits");

struct rail_htab rail_htabs[RAIL_HT_COUNT] = {
	[RAIL_HT_CTX] = { .tag = RAIL_H_TAG_CTX, .max_slots = 1u << 16 },
	[RAIL_HT_COMM] = { .tag = RAIL_H_TAG_COMM, .max_slots = 1u << RAIL_H_COMM_BITS },
	[RAIL_HT_MR] = { .tag = RAIL_H_TAG_MR, .max_slots = 1u << RAIL_H_IDX_BITS },
};

/* Everything below is under h_lock. */
static pthread_mutex_t h_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	uint32_t nsegs;
	uint32_t free_head, free_tail;	/* FIFO: a freed slot is reused last */
	uint32_t live;
} h_state[RAIL_HT_COUNT];
/* Bumped when the segments are released, so generations never repeat across it. */
static uint32_t h_epoch;

static struct rail_slot *slot_locked(enum rail_htab_id id, uint32_t idx)
{
	return rail_h_slot(&rail_htabs[id], idx);
}

static void free_push(enum rail_htab_id id, uint32_t idx)
{
	struct rail_slot *s = slot_locked(id, idx);

	s->next = RAIL_H_NONE;
	if (h_state[id].free_tail == RAIL_H_NONE)
		h_state[id].free_head = idx;
	else
		slot_locked(id, h_state[id].free_tail)->next = idx;
	h_state[id].free_tail = idx;
}

static int grow(enum rail_htab_id id)
{
	struct rail_htab *t = &rail_htabs[id];
	uint32_t n = h_state[id].nsegs, base = (h_epoch * 0x9e3779b9u) & ~1u;
	struct rail_slot *seg;

	if ((n + 1) * RAIL_H_SEG_SLOTS > t->max_slots)
		return -ENOSPC;
	seg = calloc(RAIL_H_SEG_SLOTS, sizeof(*seg));
	if (!seg)
		return -ENOMEM;
	for (uint32_t i = 0; i < RAIL_H_SEG_SLOTS; i++)
		atomic_init(&seg[i].gen, base);
	atomic_store_explicit(&t->segs[n], seg, memory_order_release);
	h_state[id].nsegs = n + 1;
	for (uint32_t i = 0; i < RAIL_H_SEG_SLOTS; i++)
		free_push(id, n * RAIL_H_SEG_SLOTS + i);
	return 0;
}

static void link_owned(uint32_t idx, struct rail_slot *s, uintptr_t owner)
{
	struct rail_slot *o = slot_locked(RAIL_HT_COMM, rail_h_index(owner));

	s->owner = rail_h_index(owner);
	s->prev = RAIL_H_NONE;
	s->next = o->owned;
	if (o->owned != RAIL_H_NONE)
		slot_locked(RAIL_HT_MR, o->owned)->prev = idx;
	o->owned = idx;
}

static void unlink_owned(struct rail_slot *s)
{
	struct rail_slot *o = slot_locked(RAIL_HT_COMM, s->owner);

	if (s->prev != RAIL_H_NONE)
		slot_locked(RAIL_HT_MR, s->prev)->next = s->next;
	else
		o->owned = s->next;
	if (s->next != RAIL_H_NONE)
		slot_locked(RAIL_HT_MR, s->next)->prev = s->prev;
}

int rail_h_alloc(enum rail_htab_id id, uint32_t kind, void *obj, uintptr_t owner, uintptr_t *h,
		 uint32_t *idx)
{
	struct rail_slot *s;
	uint32_t i, gen;
	int err = 0;

	pthread_mutex_lock(&h_lock);
	if (h_state[id].nsegs == 0)
		h_state[id].free_head = h_state[id].free_tail = RAIL_H_NONE;
	if (h_state[id].free_head == RAIL_H_NONE)
		err = grow(id);
	if (err) {
		pthread_mutex_unlock(&h_lock);
		return err;
	}
	i = h_state[id].free_head;
	s = slot_locked(id, i);
	h_state[id].free_head = s->next;
	if (h_state[id].free_head == RAIL_H_NONE)
		h_state[id].free_tail = RAIL_H_NONE;
	s->kind = kind;
	s->obj = obj;
	s->owned = RAIL_H_NONE;
	s->owner = RAIL_H_NONE;
	s->next = s->prev = RAIL_H_NONE;
	if (owner)
		link_owned(i, s, owner);
	gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
	atomic_store_explicit(&s->gen, gen, memory_order_release);
	h_state[id].live++;
	pthread_mutex_unlock(&h_lock);
	*h = (uintptr_t)((uint64_t)rail_htabs[id].tag << 56 | (uint64_t)gen << RAIL_H_IDX_BITS | i);
	if (idx)
		*idx = i;
	return 0;
}

static void free_locked(enum rail_htab_id id, uint32_t i, struct rail_slot *s)
{
	if (s->owner != RAIL_H_NONE)
		unlink_owned(s);
	atomic_store_explicit(&s->gen, atomic_load_explicit(&s->gen, memory_order_relaxed) + 1,
			      memory_order_release);
	free_push(id, i);
	h_state[id].live--;
}

int rail_h_free(enum rail_htab_id id, uintptr_t h, void **obj, uint32_t *kind)
{
	uint32_t k, i = rail_h_index(h);
	struct rail_slot *s;
	void *o;
	int err = -EINVAL;

	pthread_mutex_lock(&h_lock);
	o = rail_h_get(id, h, &k);
	if (o) {
		s = slot_locked(id, i);
		free_locked(id, i, s);
		*obj = o;
		if (kind)
			*kind = k;
		err = 0;
	}
	pthread_mutex_unlock(&h_lock);
	return err;
}

int rail_h_take_owned(uintptr_t comm, void **obj)
{
	struct rail_slot *c, *s;
	uint32_t k, i;
	int got = 0;

	pthread_mutex_lock(&h_lock);
	c = rail_h_get(RAIL_HT_COMM, comm, &k) ? slot_locked(RAIL_HT_COMM, rail_h_index(comm))
					       : NULL;
	if (c && c->owned != RAIL_H_NONE) {
		i = c->owned;
		s = slot_locked(RAIL_HT_MR, i);
		*obj = s->obj;
		free_locked(RAIL_HT_MR, i, s);
		got = 1;
	}
	pthread_mutex_unlock(&h_lock);
	return got;
}

int rail_h_owned_by(uintptr_t mr, uintptr_t comm)
{
	struct rail_slot *s = rail_h_slot(&rail_htabs[RAIL_HT_MR], rail_h_index(mr));

	return s && s->owner == rail_h_index(comm);
}

uint32_t rail_h_live(enum rail_htab_id id)
{
	uint32_t n;

	pthread_mutex_lock(&h_lock);
	n = h_state[id].live;
	pthread_mutex_unlock(&h_lock);
	return n;
}

void rail_h_release_if_empty(void)
{
	pthread_mutex_lock(&h_lock);
	for (int id = 0; id < RAIL_HT_COUNT; id++) {
		if (h_state[id].live) {
			pthread_mutex_unlock(&h_lock);
			return;
		}
	}
	for (int id = 0; id < RAIL_HT_COUNT; id++) {
		for (uint32_t n = 0; n < h_state[id].nsegs; n++) {
			struct rail_slot *seg = atomic_load(&rail_htabs[id].segs[n]);

			atomic_store_explicit(&rail_htabs[id].segs[n], NULL, memory_order_release);
			free(seg);
		}
		h_state[id].nsegs = 0;
	}
	h_epoch++;
	pthread_mutex_unlock(&h_lock);
}

/* dlclose without a finalize (ABIs v6-v10 have none): give the memory back if nothing is open. */
__attribute__((destructor)) static void h_unload(void)
{
	rail_h_release_if_empty();
}
