/*
 * nccl-net-rail: the symmetric windows of an RMA collComm (rma_tcp.h).
 *
 * regMrSym is collective: every rank adds its window to its table under the
 * next index, then all exchange (status, index, base, size), so that each
 * rank knows every peer's copy and a failure anywhere fails every rank at
 * once instead of leaving the others waiting. The window is live in this
 * rank's table before its record leaves: a faster peer may put into it as
 * soon as it has every record. Indices are never reused, so a frame naming
 * a deregistered window is refused, not applied to its successor.
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rail.h"
#include "rma/rma_tcp.h"
#include "transport.h"

void rma_wins_init(struct rma_wins *t)
{
	memset(t, 0, sizeof(*t));
	pthread_rwlock_init(&t->lock, NULL);
}

static void win_free(struct rma_win *w)
{
	free(w->shadow);
	free(w->peer_base);
	free(w->peer_size);
	free(w);
}

void rma_wins_fini(struct rma_wins *t)
{
	for (uint32_t i = 0; i < t->n && i < t->cap; i++) {
		if (t->v[i])
			win_free(t->v[i]);
	}
	free(t->v);
	pthread_rwlock_destroy(&t->lock);
}

struct rma_win *rma_wins_get(struct rma_wins *t, uint32_t index)
{
	return index < t->n && index < t->cap ? t->v[index] : NULL;
}

/* Why this rank cannot register the window, or 0; *gpu: device memory. */
static int reg_check(const struct rma_mesh *m, struct rma_gpu *g, void *data, size_t size,
		     int type, int fd, const char *call, int *gpu)
{
	*gpu = 0;
	if ((type != RAIL_PTR_HOST && type != RAIL_PTR_CUDA) || fd >= 0 || (!data && size)) {
		RAIL_WARN("RMA %s(%p, %zu bytes, type 0x%x, fd %d) on device %d (rank %d of %d): "
			  "%s", call, data, size, (unsigned)type, fd, m->dev, m->rank, m->nranks,
			  fd >= 0 ? "DMA-BUF registration is not offered (ptrSupport has no DMABUF)"
			  : type != RAIL_PTR_HOST && type != RAIL_PTR_CUDA ? "unknown pointer type"
			  : "no memory at a NULL address");
		return -EINVAL;
	}
	if (type == RAIL_PTR_CUDA && size)
		return rma_gpu_win(g, data, size, call, gpu);
	return 0;
}

static struct rma_win *win_new(struct rail_rma_coll *coll, int nranks, void *data, size_t size,
			       int type, uint64_t flags, int gpu)
{
	struct rma_win *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->base = (struct rail_rma_mr){ .coll = coll, .type = type, .flags = flags,
					.base = data, .size = size };
	w->gpu = gpu;
	/* Only this plugin writes such a word, from 0: its value is known here. */
	if (gpu && (flags & RAIL_RMA_MR_SIGNAL_NEVER_RESET) &&
	    !(w->shadow = calloc(size / 8 + 1, sizeof(uint64_t)))) {
		free(w);
		return NULL;
	}
	w->peer_base = calloc((size_t)nranks, sizeof(uint64_t));
	w->peer_size = calloc((size_t)nranks, sizeof(uint64_t));
	if (!w->peer_base || !w->peer_size) {
		win_free(w);
		return NULL;
	}
	return w;
}

/*
 * Spend the next index, whatever happens (every rank spends one per call,
 * so that indices stay in step), and make w (NULL: this rank failed) the
 * window under it: live for the applier from here on.
 */
static int win_put(struct rma_wins *t, struct rma_win *w, uint32_t *index)
{
	uint32_t i;
	int err = 0;

	pthread_rwlock_wrlock(&t->lock);
	i = t->n++;
	if (i >= t->cap) {
		uint32_t cap = RAIL_MAX(2 * t->cap, i + 16);
		struct rma_win **v = realloc(t->v, cap * sizeof(*v));

		if (v) {
			memset(v + t->cap, 0, (cap - t->cap) * sizeof(*v));
			t->v = v;
			t->cap = cap;
		}
	}
	if (i < t->cap)
		t->v[i] = w;
	else
		err = w ? -ENOMEM : 0;
	if (w && !err)
		w->base.index = i;
	pthread_rwlock_unlock(&t->lock);
	*index = i;
	return err;
}

/* Every rank's record: registered the same window, under the same index? */
static int reg_agree(const struct rma_mesh *m, const struct rma_record *all, uint32_t index,
		     const char *call)
{
	for (int q = 0; q < m->nranks; q++) {
		if (all[q].status) {
			if (q != m->rank)
				RAIL_WARN("RMA %s on device %d (rank %d of %d): %s could not register "
					  "its copy of window %u (%s); failing here too", call, m->dev,
					  m->rank, m->nranks, RMA_PEER(m, q), index,
					  RAIL_ERRSTR(-all[q].status));
			return -all[q].status;
		}
		if (all[q].index != index) {
			RAIL_WARN("RMA %s on device %d (rank %d of %d): %s registered its window "
				  "#%u while this rank registered #%u: ranks must register their "
				  "windows in the same order", call, m->dev, m->rank, m->nranks,
				  RMA_PEER(m, q), all[q].index, index);
			return -EPROTO;
		}
	}
	return 0;
}

int rma_wins_reg(struct rma_wins *t, struct rma_mesh *m, struct rma_gpu *g,
		 struct rail_rma_coll *coll, void *data, size_t size, int type, uint64_t flags,
		 int fd, struct rma_win **out)
{
	const char *call = fd < 0 ? "regMrSym" : "regMrSymDmaBuf";
	struct rma_record mine = { .nranks = (uint32_t)m->nranks, .base = (uintptr_t)data,
				   .size = size };
	struct rma_record *all = calloc((size_t)m->nranks, sizeof(*all));
	struct rma_win *w = NULL;
	int gpu, err = reg_check(m, g, data, size, type, fd, call, &gpu);

	if (!err && !(w = win_new(coll, m->nranks, data, size, type, flags, gpu)))
		err = -ENOMEM;
	if (win_put(t, w, &mine.index) && w) {
		win_free(w);
		w = NULL;
		err = -ENOMEM;
	}
	mine.status = -err;
	if (!all) {
		err = -ENOMEM;
	} else {
		int xerr = rma_mesh_exchange(m, &mine, all, call);

		err = xerr ? xerr : reg_agree(m, all, mine.index, call);
	}
	if (!err) {
		for (int q = 0; q < m->nranks; q++) {
			w->peer_base[q] = all[q].base;
			w->peer_size[q] = all[q].size;
		}
		*out = w;
	} else if (w) {
		rma_wins_dereg(t, w);
	}
	free(all);
	return err;
}

void rma_wins_dereg(struct rma_wins *t, struct rma_win *w)
{
	pthread_rwlock_wrlock(&t->lock);
	if (w->base.index < t->n && t->v[w->base.index] == w)
		t->v[w->base.index] = NULL;
	pthread_rwlock_unlock(&t->lock);
	win_free(w);
}
