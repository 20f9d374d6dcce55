/*
 * nccl-net-rail: the move thread of verbs failover (layer 4.3 of src/ib/,
 * above ib_move.c, whose moves it drives; docs/FAILOVER.md).
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"

/*
 * A move needs both sides, and NCCL calls a comm only while it has
 * requests on it: a sender whose last sends completed (eager, early) may
 * not be called again until a later operation, while its peer waits for
 * the data those sends lost in the failed path. So one thread per process
 * looks every 20 ms at the comms with failover; one that NCCL has not
 * called since the last look and that has a move to make (its port went
 * down, a move in progress, the peer's MOVE waiting, lost pieces to write
 * again) is taken (rail_comm.busy: NCCL's data calls take it too, in
 * api.c, with their flight record and counters) and driven a step.
 */
#define SCAN_NS (20ull * 1000000ull)

static struct {
	pthread_mutex_t lock;
	pthread_t thread;
	int started, stop;
	int n, cap;
	struct rail_ib_comm **v;
} mt = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void drive(struct rail_ib_comm *c)
{
	unsigned calls = atomic_load_explicit(&c->base.calls, memory_order_relaxed);

	if (calls != c->seen_calls) {
		c->seen_calls = calls;	/* NCCL calls it: its calls drive the move */
		return;
	}
	if (atomic_flag_test_and_set_explicit(&c->base.busy, memory_order_acquire))
		return;
	if (!c->error && rail_ib_move_wanted(c))
		(void)c->on_move(c, rail_ib_move_trigger(c), "the move thread");
	if (!c->mv && !c->error && c->base.kind == RAIL_COMM_SEND && (c->rp_next != c->rp_end || c->batch_stale))
		(void)rail_ib_send_progress(c);	/* lost pieces, CTS by CTS */
	atomic_flag_clear_explicit(&c->base.busy, memory_order_release);
}

static void *move_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mt.lock);
	while (!mt.stop) {
		struct timespec ts = { 0, (long)SCAN_NS };

		for (int i = 0; i < mt.n; i++)
			drive(mt.v[i]);
		pthread_mutex_unlock(&mt.lock);
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&mt.lock);
	}
	pthread_mutex_unlock(&mt.lock);
	return NULL;
}

void rail_ib_move_register(struct rail_ib_comm *c)
{
	pthread_mutex_lock(&mt.lock);
	if (mt.n == mt.cap) {
		int cap = mt.cap ? 2 * mt.cap : 64;
		struct rail_ib_comm **v = realloc(mt.v, (size_t)cap * sizeof(*v));

		if (!v) {
			pthread_mutex_unlock(&mt.lock);
			return;	/* this comm moves only when NCCL calls it */
		}
		mt.v = v;
		mt.cap = cap;
	}
	mt.v[mt.n++] = c;
	if (!mt.started && !mt.stop) {
		mt.started = pthread_create(&mt.thread, NULL, move_thread, NULL) == 0;
		if (!mt.started)
			RAIL_WARN("no move thread (pthread_create failed): comms move to another path "
				  "only while NCCL calls them");
	}
	pthread_mutex_unlock(&mt.lock);
}

void rail_ib_move_unregister(struct rail_ib_comm *c)
{
	pthread_mutex_lock(&mt.lock);
	for (int i = 0; i < mt.n; i++)
		if (mt.v[i] == c) {
			mt.v[i] = mt.v[--mt.n];
			break;
		}
	pthread_mutex_unlock(&mt.lock);
}

void rail_ib_move_fini(void)
{
	pthread_mutex_lock(&mt.lock);
	mt.stop = 1;
	pthread_mutex_unlock(&mt.lock);
	if (mt.started)
		pthread_join(mt.thread, NULL);
	pthread_mutex_lock(&mt.lock);
	free(mt.v);
	mt.v = NULL;
	mt.n = mt.cap = 0;
	mt.started = mt.stop = 0;
	pthread_mutex_unlock(&mt.lock);
}
