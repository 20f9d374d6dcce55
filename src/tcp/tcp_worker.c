/*
 * nccl-net-rail: TCP helper threads. Each worker owns the data sockets
 * s with s % nthreads == its index and a single-producer (NCCL's progress
 * thread) single-consumer ring of chunks, handled strictly in order with
 * blocking send/recv. An idle worker spins briefly, then sleeps on a
 * condition variable.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

#define TCP_WORKER_STACK (256 * 1024)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* A receive returns at least this often, so a stall check sees progress. */
#define TCP_RECV_STEP (1u << 20)

static int move_chunk(struct tcp_comm *c, const struct tcp_task *t)
{
	size_t off = 0;

	while (off < t->len) {
		ssize_t n = c->is_send
			? send(t->fd, (char *)t->buf + off, t->len - off, MSG_NOSIGNAL)
			: recv(t->fd, (char *)t->buf + off, RAIL_MIN(t->len - off, TCP_RECV_STEP),
			       MSG_WAITALL);

		if (n > 0) {
			off += (size_t)n;
			if (!c->is_send) {
				atomic_fetch_add_explicit(&t->req->moved, (size_t)n,
							  memory_order_relaxed);
				atomic_fetch_add_explicit(&c->rx_moved, (uint64_t)n,
							  memory_order_relaxed);
			}
			continue;
		}
		if (n == 0)
			return -RAIL_ECLOSED;
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

/* Wait until the ring has work or the worker must stop; 0 to stop. */
static int wait_for_work(struct tcp_worker *w, uint32_t tail)
{
	uint64_t until = rail_now_ns() + w->spin_ns;

	do {
		for (int i = 0; i < 64; i++) {
			if (atomic_load_explicit(&w->head, memory_order_acquire) != tail)
				return 1;
			cpu_relax();
		}
	} while (rail_now_ns() < until);
	pthread_mutex_lock(&w->lock);
	atomic_store(&w->sleeping, 1);
	while (atomic_load(&w->head) == tail && !atomic_load(&w->stop))
		pthread_cond_wait(&w->cond, &w->lock);
	atomic_store(&w->sleeping, 0);
	pthread_mutex_unlock(&w->lock);
	return atomic_load(&w->head) != tail;
}

static void *worker_main(void *arg)
{
	struct tcp_worker *w = arg;
	struct tcp_comm *c = w->comm;
	uint32_t tail = atomic_load_explicit(&w->tail, memory_order_relaxed);

	for (;;) {
		struct tcp_task *t;
		int err;

		if (atomic_load_explicit(&w->head, memory_order_acquire) == tail &&
		    !wait_for_work(w, tail))
			break;
		t = &w->ring[tail & w->mask];
		err = atomic_load(&c->error) ? -ECANCELED : move_chunk(c, t);
		if (err) {
			/* Logged before the request shows the failure (tcp_comm_fail). */
			tcp_comm_fail(c, err, "%s %zu bytes on a data socket failed: %s; the peer "
				      "process probably died or the network dropped the connection",
				      c->is_send ? "sending" : "receiving", t->len, RAIL_ERRSTR(err));
			atomic_store(&t->req->failed, 1);
		}
		/* Before the request can complete: NCCL ends the parent step after that. */
		if (rail_unlikely(t->ev != NULL))
			rail_prof_stop(t->ev);
		atomic_fetch_sub_explicit(&t->req->pending, 1, memory_order_release);
		atomic_store_explicit(&w->tail, ++tail, memory_order_release);
	}
	return NULL;
}

void tcp_worker_push(struct tcp_comm *c, int sock, void *buf, size_t len, struct tcp_req *req,
		     void *ev)
{
	struct tcp_worker *w = &c->workers[sock % c->nthreads];
	uint32_t head = atomic_load_explicit(&w->head, memory_order_relaxed);

	/* The ring is sized for the request pool, so this wait never happens
	 * in practice; it keeps a bug from overwriting queued chunks. */
	while (head - atomic_load_explicit(&w->tail, memory_order_acquire) > w->mask)
		cpu_relax();
	w->ring[head & w->mask] = (struct tcp_task){ buf, len, c->fds[sock], req, ev };
	atomic_store(&w->head, head + 1);
	if (atomic_load(&w->sleeping)) {
		pthread_mutex_lock(&w->lock);
		pthread_cond_signal(&w->cond);
		pthread_mutex_unlock(&w->lock);
	}
}

static int worker_start(struct tcp_comm *c, struct tcp_worker *w, uint32_t ring_size)
{
	pthread_attr_t attr;
	sigset_t all, old;
	int err;

	w->comm = c;
	w->mask = ring_size - 1;
	w->spin_ns = (uint64_t)rail_param_int(RAIL_P_TCP_SPIN_US) * 1000;
	w->ring = calloc(ring_size, sizeof(*w->ring));
	if (!w->ring)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, TCP_WORKER_STACK);
	/* Helpers never take the application's signals. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = tcp_fault_thread_create();
	if (!err)
		err = -pthread_create(&w->thread, &attr, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (err) {
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		free(w->ring);
		w->ring = NULL;
		return err;
	}
	w->started = 1;
	return 0;
}

int tcp_workers_start(struct tcp_comm *c, uint32_t ring_size)
{
	for (int i = 0; i < c->nthreads; i++) {
		int err = worker_start(c, &c->workers[i], ring_size);

		if (err) {
			atomic_store(&c->closing, 1);
			tcp_workers_stop(c);
			return err;
		}
	}
	return 0;
}

void tcp_workers_stop(struct tcp_comm *c)
{
	/* Wake workers blocked in send/recv on a peer that may never answer. */
	for (int i = 0; i < c->nsocks; i++)
		if (c->fds[i] >= 0)
			shutdown(c->fds[i], SHUT_RDWR);
	for (int i = 0; i < c->nthreads; i++) {
		struct tcp_worker *w = &c->workers[i];

		if (!w->started)
			continue;
		pthread_mutex_lock(&w->lock);
		atomic_store(&w->stop, 1);
		pthread_cond_signal(&w->cond);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		free(w->ring);
		w->ring = NULL;
		w->started = 0;
	}
}
