/*
 * nccl-net-rail: the verbs handshakes' helper threads (ib_job.h).
 *
 * One queue under one lock. A thread that finds no job for LINGER_NS exits
 * and leaves itself on the exited list, joined by the next start or by fini,
 * so that no thread of the plugin outlives rail_ib_job_fini (the library
 * may be unloaded after it).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "ib/ib_job.h"
#include "rail.h"
#include "thread.h"

#define LINGER_NS (1000ull * 1000000ull)
/*
 * At most this many threads: a handshake step beyond waits in the queue.
 * Enough that a few slow RoCE RTRs (ibv_modify_qp retried for seconds)
 * hold up no other handshake, few enough that 1024 connects in flight do
 * not start a thread each (NCCL's own IB transport runs these steps on its
 * proxy thread, one at a time).
 */
#define MAX_THREADS 16

enum { J_IDLE, J_QUEUED, J_RUNNING, J_DONE };

struct worker {
	pthread_t t;
	struct worker *next;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work;		/* a job was queued, or stop */
	pthread_cond_t done;		/* a job finished, or a thread exited */
	int cond_ready;
	struct rail_ib_job *head, *tail;
	int nqueued, nidle, nthreads, stop;
	struct worker *exited;		/* to be joined */
} P = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The condition variables on the monotonic clock (the first start). Under the lock. */
static void cond_init(void)
{
	pthread_condattr_t a;

	if (P.cond_ready)
		return;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&P.work, &a);
	pthread_cond_init(&P.done, &a);
	pthread_condattr_destroy(&a);
	P.cond_ready = 1;
}

static struct rail_ib_job *pop(void)
{
	struct rail_ib_job *j = P.head;

	if (j) {
		P.head = j->next;
		if (!P.head)
			P.tail = NULL;
		j->next = NULL;
		P.nqueued--;
	}
	return j;
}

/* Wait up to LINGER_NS for a job (under the lock): NULL to exit. */
static struct rail_ib_job *next_job(void)
{
	struct timespec until;
	uint64_t end = rail_now_ns() + LINGER_NS;

	until.tv_sec = (time_t)(end / 1000000000ull);
	until.tv_nsec = (long)(end % 1000000000ull);
	while (!P.head && !P.stop) {
		int r;

		P.nidle++;
		r = pthread_cond_timedwait(&P.work, &P.lock, &until);
		P.nidle--;
		if (r == ETIMEDOUT && !P.head)
			return NULL;
	}
	return pop();
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct rail_ib_job *j;

	rail_thread_name("rail-ib-setup");
	pthread_mutex_lock(&P.lock);
	while ((j = next_job())) {
		j->state = J_RUNNING;
		pthread_mutex_unlock(&P.lock);
		rail_ib_mqp_retry_set(j->retry);
		j->fn(j);
		rail_ib_mqp_retry_set(NULL);
		pthread_mutex_lock(&P.lock);
		j->state = J_DONE;
		atomic_store(&j->done, 1);
		pthread_cond_broadcast(&P.done);
	}
	P.nthreads--;
	w->next = P.exited;
	P.exited = w;
	pthread_cond_broadcast(&P.done);
	pthread_mutex_unlock(&P.lock);
	return NULL;
}

/* Join the threads that exited (under the lock; each has returned from worker_main's last unlock). */
static void reap(void)
{
	while (P.exited) {
		struct worker *w = P.exited;

		P.exited = w->next;
		pthread_join(w->t, NULL);
		free(w);
	}
}

/* One more thread (under the lock): 0 or a negative errno. */
static int grow(void)
{
	struct worker *w = calloc(1, sizeof(*w));
	int err;

	if (!w)
		return -ENOMEM;
	err = pthread_create(&w->t, NULL, worker_main, w);
	if (err) {
		free(w);
		return -err;
	}
	P.nthreads++;
	return 0;
}

int rail_ib_job_start(struct rail_ib_job *j)
{
	int err = 0;

	pthread_mutex_lock(&P.lock);
	cond_init();
	reap();
	atomic_store(&j->done, 0);
	j->next = NULL;
	/* an idle thread for it, else a new one; with none at all, the caller runs it */
	if (P.nidle <= P.nqueued && P.nthreads < MAX_THREADS)
		err = grow();
	if (err && P.nthreads > 0)
		err = 0;
	if (!err) {
		j->state = J_QUEUED;
		if (P.tail)
			P.tail->next = j;
		else
			P.head = j;
		P.tail = j;
		P.nqueued++;
		pthread_cond_signal(&P.work);
	}
	pthread_mutex_unlock(&P.lock);
	return err;
}

int rail_ib_job_done(struct rail_ib_job *j)
{
	return atomic_load(&j->done);
}

/* Take a queued job off the queue (under the lock). */
static void unqueue(struct rail_ib_job *j)
{
	struct rail_ib_job **p = &P.head, *prev = NULL;

	while (*p && *p != j) {
		prev = *p;
		p = &(*p)->next;
	}
	if (!*p)
		return;
	*p = j->next;
	if (P.tail == j)
		P.tail = prev;
	j->next = NULL;
	P.nqueued--;
}

int rail_ib_job_cancel(struct rail_ib_job *j)
{
	int ran = 0;

	pthread_mutex_lock(&P.lock);
	if (j->state == J_QUEUED)
		unqueue(j);
	while (j->state == J_RUNNING)
		pthread_cond_wait(&P.done, &P.lock);
	ran = j->state == J_DONE;
	j->state = J_IDLE;
	pthread_mutex_unlock(&P.lock);
	return ran;
}

void rail_ib_job_fini(void)
{
	pthread_mutex_lock(&P.lock);
	if (!P.cond_ready) {
		pthread_mutex_unlock(&P.lock);
		return;
	}
	P.stop = 1;
	pthread_cond_broadcast(&P.work);
	while (P.nthreads > 0)
		pthread_cond_wait(&P.done, &P.lock);
	reap();
	P.stop = 0;
	pthread_mutex_unlock(&P.lock);
}
