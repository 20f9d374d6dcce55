/*
 * nccl-net-rail: the TCP helper threads, one bounded pool per process shared
 * by every comm (so 1,000 connections do not mean 4,000 threads).
 *
 * Each data socket (struct tcp_stream) belongs to one pool thread, chosen at
 * attach as the least loaded; a new thread is started while the pool is
 * below its bound. The comm's progress thread pushes chunks on the socket's
 * single-producer single-consumer ring and, when the socket was not already
 * queued, on its owner's inbox (a lock-free list), waking the owner through
 * an eventfd if it sleeps. The owner moves the chunks of each socket strictly
 * in order with non-blocking send/recv; a socket that is not ready waits in
 * the owner's epoll set while the owner serves others, so no socket of any
 * comm waits behind another (a blocking shared thread could deadlock two
 * processes). The watch is one-shot, armed again only when a chunk meant for
 * a helper finds the socket not ready: bytes arriving for a message that
 * NCCL's progress thread moves itself (NCCL_RAIL_TCP_DIRECT) wake no helper.
 * An owner with nothing to do polls for NCCL_RAIL_TCP_SPIN_US, then sleeps
 * in epoll_wait.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/sockios.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "prof.h"
#include "rail.h"
#include "tcp/tcp.h"
#include "thread.h"

#define TCP_POOL_STACK (256 * 1024)
/* A receive returns at least this often, so a stall check sees progress. */
#define TCP_RECV_STEP (1u << 20)
/* Bytes a socket may move in one turn before its owner serves the others. */
#define TCP_TURN_BYTES (4u << 20)
#define TCP_POOL_EVENTS 64
/* Bytes NCCL's progress thread moves per socket in one test() call. */
#define TCP_HELP_BYTES (512u << 10)

struct tcp_pool_thread {
	pthread_t thread;
	int epfd, evfd;
	int nstreams;			/* attached sockets, under pool_lock */
	uint64_t spin_ns;
	_Atomic(struct tcp_stream *) inbox;
	_Atomic int sleeping;
	_Atomic int stop;
	struct tcp_stream *act_head, *act_tail;	/* owner only */
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tcp_pool_thread *pool_threads[TCP_POOL_MAX];
static int pool_n;		/* started */
static _Atomic int pool_running;
static int pool_warned;		/* a thread beyond the first could not start */
static struct tcp_pool_thread *pool_spare;	/* fds of the next thread, no thread yet */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

int tcp_pool_threads(void)
{
	return atomic_load(&pool_running);
}

static void wake(struct tcp_pool_thread *t)
{
	uint64_t one = 1;

	if (atomic_load(&t->sleeping) && write(t->evfd, &one, sizeof(one)) < 0)
		(void)0; /* the counter is full: a wake-up is pending anyway */
}

/* Put the stream on its owner's inbox unless it is there already. */
static void kick(struct tcp_stream *s)
{
	struct tcp_pool_thread *t = s->owner;
	struct tcp_stream *old;

	if (atomic_exchange(&s->kicked, 1))
		return;
	old = atomic_load(&t->inbox);
	do
		s->inbox_next = old;
	while (!atomic_compare_exchange_weak(&t->inbox, &old, s));
	wake(t);
}

static int try_serve(struct tcp_stream *s, size_t budget, int helper);

/* Chunks of every comm of the process pushed and not yet done (moved, or acknowledged). */
static _Atomic int pool_queued;
/* Chunks pushed direct, and chunks helper threads moved (for tests). */
static _Atomic uint64_t direct_chunks, helper_chunks;

int tcp_pool_idle(void)
{
	return atomic_load_explicit(&pool_queued, memory_order_relaxed) == 0;
}

void tcp_pool_push(struct tcp_comm *c, int sock, void *buf, size_t len, struct tcp_req *req,
		   void *ev, int direct)
{
	struct tcp_stream *s = &c->streams[sock];
	uint32_t head = atomic_load_explicit(&s->head, memory_order_relaxed);

	/* The ring is sized for the request pool, so this wait never happens
	 * in practice; it keeps a bug from overwriting queued chunks. */
	while (head - atomic_load_explicit(&s->ack_tail, memory_order_acquire) > s->mask)
		cpu_relax();
	s->ring[head & s->mask] = (struct tcp_task){ buf, len, s->fd, req, ev, s->pushed, direct };
	s->pushed += len;
	atomic_fetch_add_explicit(&pool_queued, 1, memory_order_relaxed);
	atomic_store_explicit(&s->head, head + 1, memory_order_release);
	if (direct)
		atomic_fetch_add_explicit(&direct_chunks, 1, memory_order_relaxed);
	if (!direct || try_serve(s, TCP_HELP_BYTES, 0) > 0)
		kick(s);
}

/* What the owner's epoll set watches for on the stream's socket: one event, then re-armed. */
static struct epoll_event stream_event(struct tcp_stream *s)
{
	return (struct epoll_event){ .events = (s->comm->is_send ? EPOLLOUT : EPOLLIN) |
					       EPOLLET | EPOLLONESHOT, .data.ptr = s };
}

/*
 * A chunk a helper moves (not a direct one) could not move on: watch the
 * socket again, so its owner wakes when it is ready. Called holding the
 * stream's busy flag, by whichever thread found it not ready: a move swaps
 * the socket only holding every stream's flag (tcp_pool_pause). A socket
 * ready already reports at once (epoll polls it when re-armed), so
 * readiness between the EAGAIN and this call is not lost.
 */
static void rewatch(struct tcp_stream *s)
{
	struct epoll_event ev = stream_event(s);

	if (epoll_ctl(s->owner->epfd, EPOLL_CTL_MOD, s->fd, &ev))
		RAIL_WARN("TCP helper: watching data socket %d (fd %d) of the %s comm to %s again "
			  "failed: %s; its chunks move only while NCCL polls the request",
			  s->index + 1, s->fd, s->comm->is_send ? "send" : "receive",
			  s->comm->peer, RAIL_ERRSTR(-errno));
}

static void activate(struct tcp_pool_thread *t, struct tcp_stream *s)
{
	if (s->active)
		return;
	s->active = 1;
	s->act_next = NULL;
	s->act_prev = t->act_tail;
	if (t->act_tail)
		t->act_tail->act_next = s;
	else
		t->act_head = s;
	t->act_tail = s;
}

static void deactivate(struct tcp_pool_thread *t, struct tcp_stream *s)
{
	if (!s->active)
		return;
	s->active = 0;
	if (s->act_prev)
		s->act_prev->act_next = s->act_next;
	else
		t->act_head = s->act_next;
	if (s->act_next)
		s->act_next->act_prev = s->act_prev;
	else
		t->act_tail = s->act_prev;
}

/* Move bytes of the head chunk without blocking: 0 when it is complete, -EAGAIN, -errno. */
static int move_some(struct tcp_stream *s, const struct tcp_task *t, size_t *budget)
{
	struct tcp_comm *c = s->comm;

	while (s->off < t->len) {
		/* After a move the receiver first reads what the old socket still holds. */
		int old = !c->is_send && rail_unlikely(s->old_left > 0);
		ssize_t n = c->is_send
			? send(s->fd, (char *)t->buf + s->off, t->len - s->off,
			       MSG_NOSIGNAL | MSG_DONTWAIT)
			: recv(old ? s->old_fd : s->fd, (char *)t->buf + s->off,
			       RAIL_MIN(RAIL_MIN(t->len - s->off, TCP_RECV_STEP),
					old ? s->old_left : SIZE_MAX), MSG_DONTWAIT);

		if (n > 0) {
			s->off += (size_t)n;
			s->moved += (uint64_t)n;
			if (old && !(s->old_left -= (uint64_t)n)) {
				close(s->old_fd);
				s->old_fd = -1;
			}
			if (!c->is_send) {
				atomic_fetch_add_explicit(&t->req->moved, (size_t)n,
							  memory_order_relaxed);
				atomic_fetch_add_explicit(&c->rx_moved, (uint64_t)n,
							  memory_order_relaxed);
			}
			if (*budget <= (size_t)n && s->off < t->len) {
				*budget = 0;
				return -EINPROGRESS;
			}
			*budget -= (size_t)n;
			continue;
		}
		if (n == 0)
			return -RAIL_ECLOSED;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

void tcp_pool_counts(uint64_t *direct, uint64_t *helper)
{
	*direct = atomic_load_explicit(&direct_chunks, memory_order_relaxed);
	*helper = atomic_load_explicit(&helper_chunks, memory_order_relaxed);
}

/* A chunk is done: its request may complete (the profiler event ends first). */
static void task_done(struct tcp_task *t, int helper)
{
	if (helper)
		atomic_fetch_add_explicit(&helper_chunks, 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&pool_queued, 1, memory_order_relaxed);
	/* Before the request can complete: NCCL ends the parent step after that. */
	if (rail_unlikely(t->ev != NULL))
		rail_prof_stop(t->ev);
	atomic_fetch_sub_explicit(&t->req->pending, 1, memory_order_release);
}

/* Send with ack completion (s->busy held): complete the chunks the peer's kernel has. */
static void ack_advance(struct tcp_stream *s)
{
	uint32_t k = atomic_load_explicit(&s->ack_tail, memory_order_relaxed);
	uint32_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
	uint64_t acked;
	int outq = 0;

	if (k == tail || ioctl(s->fd, SIOCOUTQ, &outq) || outq < 0)
		return;
	acked = s->moved - RAIL_MIN((uint64_t)outq, s->moved);
	while (k != tail && s->ring[k & s->mask].start + s->ring[k & s->mask].len <= acked)
		task_done(&s->ring[k++ & s->mask], 0);
	atomic_store_explicit(&s->ack_tail, k, memory_order_release);
}

/* Serve one socket (s->busy held): 1 while it has chunks it can move now, 0 when empty or not ready. */
static int serve(struct tcp_stream *s, size_t budget, int helper)
{
	struct tcp_comm *c = s->comm;

	if (rail_unlikely(atomic_load_explicit(&c->moving, memory_order_relaxed)))
		return 0;
	for (;;) {
		uint32_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
		struct tcp_task *t;
		int err;

		if (atomic_load_explicit(&s->head, memory_order_acquire) == tail) {
			if (c->ack)
				ack_advance(s);
			return 0;
		}
		t = &s->ring[tail & s->mask];
		err = atomic_load(&c->error) ? -ECANCELED : move_some(s, t, &budget);
		if (err == -EAGAIN) {
			if (!t->direct)
				rewatch(s);
			if (c->ack)
				ack_advance(s);
			return 0;
		}
		if (err == -EINPROGRESS)
			return 1;
		if (err && tcp_path_failed(c, err))
			return 0; /* the comm moves: the chunk stays where it is */
		if (err) {
			/* Logged before the request shows the failure (tcp_comm_fail). */
			tcp_comm_fail(c, err, "%s bytes %zu..%zu of a %zu-byte chunk on data socket "
				      "%d failed: %s; the peer process probably died or the network "
				      "dropped the connection", c->is_send ? "sending" : "receiving",
				      s->off, t->len, t->len, s->index + 1, RAIL_ERRSTR(err));
			atomic_store(&t->req->failed, 1);
		}
		s->off = 0;
		if (c->ack) {
			/* Written: it completes once acknowledged (ack_advance), or at close. */
			atomic_store_explicit(&s->tail, tail + 1, memory_order_release);
			if (!budget)
				return 1;
			continue;
		}
		task_done(t, helper);
		atomic_store_explicit(&s->tail, tail + 1, memory_order_release);
		atomic_store_explicit(&s->ack_tail, tail + 1, memory_order_release);
		if (!budget)
			return 1;
	}
}

/*
 * Serve the socket unless another thread is at it: 1 when chunks it could
 * move are left (the budget ran out), 0 when none or the socket is not
 * ready, -1 when another thread holds it (which then looks again, so no
 * readiness is lost).
 */
static int try_serve(struct tcp_stream *s, size_t budget, int helper)
{
	int more = 0;

	atomic_store(&s->again, 1);
	while (!more && atomic_load(&s->again)) {
		if (atomic_exchange(&s->busy, 1))
			return -1;
		atomic_store(&s->again, 0);
		more = serve(s, budget, helper);
		atomic_store(&s->busy, 0);
	}
	return more;
}

void tcp_pool_help(struct tcp_comm *c)
{
	for (int i = 0; i < c->nattached; i++) {
		struct tcp_stream *s = &c->streams[i];

		if (atomic_load_explicit(&s->head, memory_order_relaxed) ==
		    atomic_load_explicit(&s->tail, memory_order_acquire))
			continue;
		/* Chunks left: the owner takes over (it may have seen it busy). */
		if (try_serve(s, TCP_HELP_BYTES, 0) > 0)
			kick(s);
	}
}

/* The comm is closing: forget the socket; its remaining chunks are failed. */
static void forget(struct tcp_pool_thread *t, struct tcp_stream *s)
{
	uint32_t tail;

	/* The progress thread may be in tcp_pool_help: wait for it; busy stays set. */
	while (atomic_exchange(&s->busy, 1))
		cpu_relax();
	tail = atomic_load_explicit(&s->ack_tail, memory_order_relaxed);
	deactivate(t, s);
	epoll_ctl(t->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	while (atomic_load_explicit(&s->head, memory_order_acquire) != tail) {
		struct tcp_task *k = &s->ring[tail & s->mask];

		atomic_store(&k->req->failed, 1);
		atomic_fetch_sub_explicit(&pool_queued, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&k->req->pending, 1, memory_order_release);
		++tail;
		atomic_store_explicit(&s->ack_tail, tail, memory_order_release);
		atomic_store_explicit(&s->tail, tail, memory_order_release);
	}
	/* The last touch: the closer frees the stream once it sees this. */
	atomic_store_explicit(&s->detached, 1, memory_order_release);
}

/*
 * A stream taken off the inbox: serve it, or forget it once its comm is
 * closing. A forgotten stream keeps kicked set, so no kick queues it again:
 * the closer's own kick (tcp_pool_detach) must not put it back on the inbox
 * of an owner that has forgotten it (a second forget would spin on busy,
 * which the first leaves set, or touch the comm freed meanwhile). kicked is
 * cleared before closing is read, and the closer sets closing before its
 * kick, so a stream whose close starts now is either seen closing here or
 * queued again by that kick, never lost.
 */
static void take_one(struct tcp_pool_thread *t, struct tcp_stream *s)
{
	if (!atomic_load(&s->comm->closing)) {
		atomic_store(&s->kicked, 0);
		if (!atomic_load(&s->comm->closing)) {
			activate(t, s);
			return;
		}
		/* Closing since: a kick that found kicked clear queues it again. */
		if (atomic_exchange(&s->kicked, 1))
			return;
	}
	forget(t, s);
}

static void take_inbox(struct tcp_pool_thread *t)
{
	struct tcp_stream *s = atomic_exchange(&t->inbox, NULL);

	while (s) {
		struct tcp_stream *next = s->inbox_next;

		take_one(t, s);
		s = next;
	}
}

/* Wait for events: poll while busy or spinning, then sleep. */
static void wait_events(struct tcp_pool_thread *t, uint64_t *idle_since)
{
	struct epoll_event ev[TCP_POOL_EVENTS];
	int timeout = 0, slept = 0, n;

	if (t->act_head || atomic_load_explicit(&t->inbox, memory_order_relaxed)) {
		*idle_since = 0;
	} else {
		uint64_t now = rail_now_ns();

		if (!*idle_since)
			*idle_since = now;
		if (now - *idle_since >= t->spin_ns) {
			/* Seen by kick() after its push, or the push is seen here. */
			atomic_store(&t->sleeping, 1);
			slept = 1;
			if (!atomic_load(&t->inbox) && !atomic_load(&t->stop))
				timeout = -1;
		} else {
			cpu_relax();
		}
	}
	n = epoll_wait(t->epfd, ev, TCP_POOL_EVENTS, timeout);
	if (slept)
		atomic_store(&t->sleeping, 0);
	for (int i = 0; i < n; i++) {
		struct tcp_stream *s = ev[i].data.ptr;

		if (!s) {
			uint64_t v;

			if (read(t->evfd, &v, sizeof(v)) < 0)
				(void)0; /* drained already */
			continue;
		}
		/* Acquire: the attaching thread's set-up happens before this. */
		if (atomic_load_explicit(&s->ready, memory_order_acquire))
			activate(t, s);
	}
}

static void *pool_main(void *arg)
{
	struct tcp_pool_thread *t = arg;
	uint64_t idle_since = 0;

	rail_thread_name("rail-tcp-help");
	while (!atomic_load(&t->stop)) {
		struct tcp_stream *s, *next;

		wait_events(t, &idle_since);
		take_inbox(t);
		for (s = t->act_head; s; s = next) {
			next = s->act_next;
			if (try_serve(s, TCP_TURN_BYTES, 1) <= 0)
				deactivate(t, s);
		}
	}
	return NULL;
}

static void thread_free(struct tcp_pool_thread *t)
{
	if (t->epfd >= 0)
		close(t->epfd);
	if (t->evfd >= 0)
		close(t->evfd);
	free(t);
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&pool_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&pool_lock);
}

/*
 * A forked child has none of the pool's threads: it starts its own for the
 * comms it opens (the comms it inherited are not usable there, as with NCCL).
 * The old threads' fds stay open (close-on-exec), so an inherited comm that
 * is misused cannot write into a file that took their numbers.
 */
static void atfork_child(void)
{
	/* The spare's epoll set is the parent's too: the child makes its own. */
	if (pool_spare)
		thread_free(pool_spare);
	pool_spare = NULL;
	for (int i = 0; i < pool_n; i++)
		pool_threads[i] = NULL;
	pool_n = 0;
	pool_warned = 0;
	atomic_store(&pool_running, 0);
	pthread_mutex_unlock(&pool_lock);
}

static void atfork_register(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Before the pool makes its first fds (the spare's or a thread's). */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A thread's epoll set and eventfd, not started yet. */
static int thread_alloc(struct tcp_pool_thread **out)
{
	struct tcp_pool_thread *t = calloc(1, sizeof(*t));
	struct epoll_event ev = { .events = EPOLLIN };
	int err;

	if (!t)
		return -ENOMEM;
	t->spin_ns = (uint64_t)rail_param_int(RAIL_P_TCP_SPIN_US) * 1000;
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	t->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->epfd < 0 || t->evfd < 0 || epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->evfd, &ev)) {
		err = -errno;
		thread_free(t);
		return err;
	}
	*out = t;
	return 0;
}

/* Start one more pool thread (the spare's fds first). Holds pool_lock. */
static int thread_start(void)
{
	struct tcp_pool_thread *t = pool_spare;
	pthread_attr_t attr;
	sigset_t all, old;
	int err;

	pthread_once(&atfork_once, atfork_register);
	if (!t) {
		err = thread_alloc(&t);
		if (err)
			return err;
	}
	pool_spare = NULL;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, TCP_POOL_STACK);
	/* Helpers never take the application's signals. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = tcp_fault_thread_create();
	if (!err)
		err = -pthread_create(&t->thread, &attr, pool_main, t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (err) {
		pool_spare = t;
		return err;
	}
	pool_threads[pool_n++] = t;
	atomic_fetch_add(&pool_running, 1);
	return 0;
}

/* The owner for a new socket: the least loaded thread, or a new one while below the bound. */
static int pick_owner(struct tcp_comm *c, int bound, struct tcp_pool_thread **out)
{
	struct tcp_pool_thread *best = NULL;
	int err = 0;

	for (int i = 0; i < pool_n; i++)
		if (!best || pool_threads[i]->nstreams < best->nstreams)
			best = pool_threads[i];
	if ((!best || best->nstreams > 0) && pool_n < bound) {
		err = thread_start();
		if (!err)
			best = pool_threads[pool_n - 1];
		else if (pool_n && !pool_warned) {
			pool_warned = 1;
			RAIL_WARN("%s comm on %s, peer %s: starting TCP helper thread %d (epoll, "
				  "eventfd, pthread_create) failed: %s; going on with the %d running "
				  "(check ulimit -n and -u, RLIMIT_NPROC, the pids cgroup's pids.max)",
				  c->is_send ? "send" : "receive", tcp_comm_dev_name(c), c->peer,
				  pool_n + 1, RAIL_ERRSTR(err), pool_n);
		}
	}
	if (!best)
		return err ? err : -EAGAIN;
	*out = best;
	return 0;
}

/*
 * At a comm's listen or connect, take the fds of the first thread (its
 * epoll set and eventfd) before the comm's sockets can take the last fds of
 * a process near its fd limit; the thread itself starts with the first
 * connection (a process may still fork single-threaded after listen). Best
 * effort: attach reports a failure.
 */
void tcp_pool_reserve(void)
{
	/* A process that forks after listen, before any connection, must not share the spare. */
	pthread_once(&atfork_once, atfork_register);
	pthread_mutex_lock(&pool_lock);
	if (!pool_n && !pool_spare)
		thread_alloc(&pool_spare);
	pthread_mutex_unlock(&pool_lock);
}

static int stream_attach(struct tcp_comm *c, int i, uint32_t ring_size, int bound)
{
	struct tcp_stream *s = &c->streams[i];
	struct epoll_event ev;
	int err;

	s->comm = c;
	s->fd = c->fds[i];
	s->index = i;
	s->mask = ring_size - 1;
	s->ring = calloc(ring_size, sizeof(*s->ring));
	if (!s->ring)
		return -ENOMEM;
	err = pick_owner(c, bound, &s->owner);
	if (err)
		goto free_ring;
	atomic_store_explicit(&s->ready, 1, memory_order_release);
	/* Not armed: the first chunk a helper's turn cannot move arms it (rewatch). */
	ev = stream_event(s);
	ev.events &= ~(uint32_t)(EPOLLIN | EPOLLOUT);
	if (epoll_ctl(s->owner->epfd, EPOLL_CTL_ADD, s->fd, &ev)) {
		err = -errno;
		goto free_ring;
	}
	s->owner->nstreams++;
	return 0;
free_ring:
	free(s->ring);
	s->ring = NULL;
	return err;
}

int tcp_pool_attach(struct tcp_comm *c, uint32_t ring_size)
{
	char why[128];
	int bound = tcp_pool_size(why, sizeof(why)), err = 0;

	pthread_mutex_lock(&pool_lock);
	for (int i = 0; i < c->nsocks && !err; i++) {
		err = stream_attach(c, i, ring_size, bound);
		if (!err)
			c->nattached++;
	}
	pthread_mutex_unlock(&pool_lock);
	if (err) {
		atomic_store(&c->closing, 1);
		tcp_pool_detach(c);
	}
	return err;
}

static void sleep_us(long us)
{
	struct timespec ts = { 0, us * 1000 };

	nanosleep(&ts, NULL);
}

void tcp_pool_detach(struct tcp_comm *c)
{
	/* c->closing is set: each owner forgets the socket at its next look. */
	for (int i = 0; i < c->nattached; i++)
		kick(&c->streams[i]);
	for (int i = 0; i < c->nattached; i++) {
		struct tcp_stream *s = &c->streams[i];

		for (int spin = 0; !atomic_load_explicit(&s->detached, memory_order_acquire);
		     spin++) {
			if (spin < 1000)
				cpu_relax();
			else
				sleep_us(50);
		}
	}
	pthread_mutex_lock(&pool_lock);
	for (int i = 0; i < c->nattached; i++) {
		c->streams[i].owner->nstreams--;
		free(c->streams[i].ring);
		c->streams[i].ring = NULL;
	}
	pthread_mutex_unlock(&pool_lock);
	c->nattached = 0;
}

void tcp_pool_stop(void)
{
	pthread_mutex_lock(&pool_lock);
	for (int i = 0; i < pool_n; i++) {
		struct tcp_pool_thread *t = pool_threads[i];
		uint64_t one = 1;

		atomic_store(&t->stop, 1);
		if (write(t->evfd, &one, sizeof(one)) < 0)
			(void)0; /* a wake-up is pending anyway */
		pthread_join(t->thread, NULL);
		thread_free(t);
		pool_threads[i] = NULL;
	}
	pool_n = 0;
	pool_warned = 0;
	if (pool_spare)
		thread_free(pool_spare);
	pool_spare = NULL;
	atomic_store(&pool_running, 0);
	pthread_mutex_unlock(&pool_lock);
}

/* ---- failover (tcp_move.c): the streams of a comm that moves ---- */

void tcp_pool_pause(struct tcp_comm *c)
{
	for (int i = 0; i < c->nattached; i++)
		while (atomic_exchange(&c->streams[i].busy, 1))
			cpu_relax();
}

void tcp_pool_resume(struct tcp_comm *c)
{
	for (int i = 0; i < c->nattached; i++) {
		atomic_store(&c->streams[i].busy, 0);
		kick(&c->streams[i]);
	}
}

static void swap_fd(struct tcp_stream *s, int fd)
{
	struct epoll_event ev = stream_event(s);

	epoll_ctl(s->owner->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	s->fd = fd;
	s->comm->fds[s->index] = fd;
	if (epoll_ctl(s->owner->epfd, EPOLL_CTL_ADD, fd, &ev))
		RAIL_WARN("failover: watching the new data socket %d failed: %s", s->index + 1,
			  RAIL_ERRSTR(-errno));
}

int64_t tcp_pool_resume_send(struct tcp_comm *c, int i, uint64_t pos, int fd)
{
	struct tcp_stream *s = &c->streams[i];
	uint32_t k = atomic_load_explicit(&s->ack_tail, memory_order_relaxed);
	uint32_t head = atomic_load_explicit(&s->head, memory_order_acquire);
	uint64_t base = k != head ? s->ring[k & s->mask].start : s->pushed;
	int64_t resent = (int64_t)(s->moved - pos);
	int old;

	/* The receiver has at least what was acknowledged, at most what was written. */
	if (pos < base || pos > s->moved)
		return -EPROTO;
	while (k != head && s->ring[k & s->mask].start + s->ring[k & s->mask].len <= pos)
		task_done(&s->ring[k++ & s->mask], 0);
	atomic_store_explicit(&s->ack_tail, k, memory_order_release);
	atomic_store_explicit(&s->tail, k, memory_order_release);
	s->off = k != head ? (size_t)(pos - s->ring[k & s->mask].start) : 0;
	s->moved = pos;
	old = s->fd;
	swap_fd(s, fd);
	close(old);
	return resent;
}

int64_t tcp_pool_recv_pos(struct tcp_comm *c, int i, uint64_t *inq)
{
	struct tcp_stream *s = &c->streams[i];
	int n = 0;

	if (s->old_left)
		return -EBUSY; /* the leftovers of the last move are still being read */
	if (ioctl(s->fd, FIONREAD, &n) || n < 0)
		return -errno;
	*inq = (uint64_t)n;
	return (int64_t)(s->moved + (uint64_t)n);
}

void tcp_pool_switch_recv(struct tcp_comm *c, int i, uint64_t inq, int fd)
{
	struct tcp_stream *s = &c->streams[i];
	int old = s->fd;

	swap_fd(s, fd);
	if (inq) {
		s->old_fd = old;
		s->old_left = inq;
	} else {
		close(old);
	}
}

void tcp_pool_ack(struct tcp_comm *c)
{
	if (atomic_load_explicit(&c->moving, memory_order_relaxed))
		return; /* the receiver takes its positions: nothing completes from here */
	for (int i = 0; i < c->nattached; i++) {
		struct tcp_stream *s = &c->streams[i];

		if (atomic_load_explicit(&s->ack_tail, memory_order_relaxed) ==
		    atomic_load_explicit(&s->tail, memory_order_acquire))
			continue;
		if (atomic_exchange(&s->busy, 1))
			continue;
		ack_advance(s);
		atomic_store(&s->busy, 0);
	}
}
