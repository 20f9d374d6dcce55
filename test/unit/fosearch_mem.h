/*
 * nccl-net-rail unit tests: the seeded randomized failover search
 * (test_ib_fosearch.c), part 2: each side's memory. Buffers live in arenas
 * (separate allocations, so that registrations of different arenas have
 * different keys); a slot (a send buffer of one tag's window, or buffer i of
 * a receive window slot) sits in one arena, under the arena's whole
 * registration or a registration of its own bytes (a sub-range: the cache
 * hands back the same MR, a handle of its own). Payloads are a pattern of
 * (seed, message), so every byte delivered is checked without a copy.
 *
 * Include after fosearch.h, in test_ib_fosearch.c only.
 */
#ifndef RAIL_FOSEARCH_MEM_H
#define RAIL_FOSEARCH_MEM_H

#include <stdlib.h>
#include <string.h>

#include "api.h"

#define FO_GUARD 64		/* poisoned bytes after each receive buffer */
#define FO_POISON 0xee

struct fo_arena {
	uint8_t *p;
	size_t len;
	int live;
};

struct fo_reg {
	int arena;
	size_t off, len;
	void *mh;
	int live;
};

struct fo_slot {
	int arena, reg;
	size_t off, len;
	int busy;		/* a request uses it */
	int holds;		/* sender: the message whose bytes it holds (-1: none) */
};

struct fo_mem {
	int dmabuf_fd;			/* >= 0: GPU memory, registered by regMrDmaBuf */
	int narena, nreg, nslot;
	struct fo_arena arena[FO_MAXARENA];
	struct fo_reg reg[FO_MAXREG];
	struct fo_slot slot[FO_MAXSLOT];
};

static inline uint8_t *fo_slot_buf(const struct fo_mem *m, int s)
{
	return m->arena[m->slot[s].arena].p + m->slot[s].off;
}

/* ---- the pattern ---------------------------------------------------------------- */

static inline uint64_t fo_pat_word(uint64_t seed, int msg, size_t w)
{
	return fo_mix((seed << 20) ^ ((uint64_t)(msg + 1) << 44) ^ (w * 0x9e3779b97f4a7c15ull));
}

static void fo_fill(uint8_t *p, size_t n, uint64_t seed, int msg)
{
	size_t w;

	for (w = 0; (w + 1) * 8 <= n; w++) {
		uint64_t v = fo_pat_word(seed, msg, w);

		memcpy(p + w * 8, &v, 8);
	}
	if (w * 8 < n) {
		uint64_t v = fo_pat_word(seed, msg, w);

		memcpy(p + w * 8, &v, n - w * 8);
	}
}

/* The first byte of p[0, n) that is not message msg's, or n. */
static size_t fo_diff(const uint8_t *p, size_t n, uint64_t seed, int msg)
{
	for (size_t w = 0; w * 8 < n; w++) {
		uint64_t v = fo_pat_word(seed, msg, w);
		size_t k = n - w * 8 < 8 ? n - w * 8 : 8;

		if (memcmp(p + w * 8, &v, k)) {
			for (size_t b = 0; b < k; b++)
				if (p[w * 8 + b] != ((const uint8_t *)&v)[b])
					return w * 8 + b;
		}
	}
	return n;
}

/* Whose bytes the 8-byte word at off holds (another message of the seed's), or -1. */
static int fo_whose(const uint8_t *p, size_t n, size_t off, uint64_t seed, int nmsg)
{
	size_t w = off / 8;

	if (w * 8 + 8 > n)
		return -1;
	for (int m = 0; m < nmsg; m++) {
		uint64_t v = fo_pat_word(seed, m, w);

		if (!memcmp(p + w * 8, &v, 8))
			return m;
	}
	return -1;
}

/* ---- arenas and registrations ------------------------------------------------------ */

static int fo_arena_new(struct fo_mem *m, size_t len)
{
	int a = m->narena;
	size_t al = (len + 4095) & ~(size_t)4095;

	if (a >= FO_MAXARENA)
		return -1;
	m->arena[a].p = aligned_alloc(4096, al ? al : 4096);
	if (!m->arena[a].p)
		return -1;
	m->arena[a].len = al ? al : 4096;
	m->arena[a].live = 1;
	m->narena++;
	return a;
}

/* A registration of [off, off + len) of arena a on comm; its index, or -1 (*res says why). */
static int fo_reg_new(struct fo_mem *m, void *comm, int a, size_t off, size_t len,
		      ncclResult_t *res)
{
	int r = m->nreg;

	*res = ncclSuccess;
	if (r >= FO_MAXREG)
		return -1;
	if (m->dmabuf_fd >= 0)
		*res = rail_net_reg_mr_dmabuf(comm, m->arena[a].p + off, len, NCCL_PTR_CUDA, 0,
					      m->dmabuf_fd, &m->reg[r].mh);
	else
		*res = rail_net_reg_mr(comm, m->arena[a].p + off, len, NCCL_PTR_HOST, &m->reg[r].mh);
	if (*res != ncclSuccess)
		return -1;
	m->reg[r].arena = a;
	m->reg[r].off = off;
	m->reg[r].len = len;
	m->reg[r].live = 1;
	m->nreg++;
	return r;
}

static int fo_reg_users(const struct fo_mem *m, int r)
{
	int n = 0;

	for (int s = 0; s < m->nslot; s++)
		n += m->slot[s].reg == r;
	return n;
}

/*
 * Registration r is no longer used by any slot: deregister it (NCCL may,
 * once the requests on it completed), and free its arena when nothing else
 * lives there, so that a read of it is a use after free for ASan.
 */
static ncclResult_t fo_reg_release(struct fo_mem *m, void *comm, int r)
{
	ncclResult_t res;
	int a = m->reg[r].arena, left = 0;

	if (!m->reg[r].live || fo_reg_users(m, r))
		return ncclSuccess;
	res = rail_net_dereg_mr(comm, m->reg[r].mh);
	m->reg[r].live = 0;
	for (int k = 0; k < m->nreg; k++)
		left += m->reg[k].live && m->reg[k].arena == a;
	for (int s = 0; s < m->nslot; s++)
		left += m->slot[s].arena == a;
	if (!left && m->arena[a].live) {
		free(m->arena[a].p);
		m->arena[a].p = NULL;
		m->arena[a].live = 0;
	}
	return res;
}

/*
 * The initial layout of one side (nslot slots of len bytes): arenas, the
 * whole-arena registrations and each slot's own, in the order drawn.
 */
static ncclResult_t fo_mem_init(struct fo_mem *m, void *comm, const struct fo_layout *l, int nslot,
				size_t len, int dmabuf_fd)
{
	size_t used[4] = { 0 }, off[FO_MAXSLOT];
	int whole[4];
	ncclResult_t res = ncclSuccess;

	memset(m, 0, sizeof(*m));
	m->dmabuf_fd = dmabuf_fd;
	m->nslot = nslot;
	for (int s = 0; s < nslot; s++) {
		int a = l->slot_arena[s];

		off[s] = ((used[a] + 63) & ~(size_t)63) + (size_t)l->slot_mis[s];
		used[a] = off[s] + len + FO_GUARD;
	}
	for (int a = 0; a < l->narena; a++)
		if (fo_arena_new(m, used[a] ? used[a] : 64) != a)
			return ncclSystemError;
	for (int s = 0; s < nslot; s++) {
		m->slot[s].arena = l->slot_arena[s];
		m->slot[s].off = off[s];
		m->slot[s].len = len;
		m->slot[s].holds = -1;
		m->slot[s].reg = -1;
	}
	for (int pass = 0; pass < 2; pass++) {
		if (pass == !l->whole_first) {
			for (int a = 0; a < l->narena; a++) {
				whole[a] = -1;
				if (l->whole[a] &&
				    (whole[a] = fo_reg_new(m, comm, a, 0, m->arena[a].len, &res)) < 0)
					return res ? res : ncclSystemError;
			}
			continue;
		}
		for (int s = 0; s < nslot; s++)
			if (l->slot_sub[s] &&
			    (m->slot[s].reg = fo_reg_new(m, comm, l->slot_arena[s], off[s], len, &res)) < 0)
				return res ? res : ncclSystemError;
	}
	for (int s = 0; s < nslot; s++)
		if (m->slot[s].reg < 0)
			m->slot[s].reg = whole[m->slot[s].arena];
	/* a whole registration that no slot ended up under stays: NCCL keeps such ones too */
	return ncclSuccess;
}

/* Deregister what is still registered (the comm is still open). */
static ncclResult_t fo_mem_dereg(struct fo_mem *m, void *comm)
{
	ncclResult_t res = ncclSuccess;

	for (int r = 0; r < m->nreg; r++) {
		if (!m->reg[r].live)
			continue;
		if (comm && rail_net_dereg_mr(comm, m->reg[r].mh) != ncclSuccess)
			res = ncclInternalError;
		m->reg[r].live = 0;
	}
	return res;
}

#endif
