/*
 * nccl-net-rail: the move thread of verbs failover (layer 4.3 of src/ib/,
 * above ib_move.c, whose moves it drives; docs/FAILOVER.md).
 *
 * A move needs both sides, and NCCL calls a comm only while it has
 * requests on it: a sender whose last sends completed (eager, early) may
 * not be called again until a later operation, while its peer waits for
 * the data those sends lost in the failed path. So one thread per process
 * drives the moves of the comms with failover that NCCL does not call. It
 * sleeps in epoll_wait and wakes only for
 *   - a comm's handshake socket turning readable: the peer's MOVE (each
 *     idle comm's socket waits in the epoll set, one-shot, armed again
 *     when the comm is idle again; one that reached end of file is not);
 *   - an async event that may start or end moves (PORT_ERR, PORT_ACTIVE,
 *     DEVICE_FATAL, QP_FATAL: ib_async.c calls the hook set here), after
 *     which it looks at every comm once;
 *   - a move NCCL's call started (rail_ib_move_watch), and a move's verbs
 *     work handed to it (rail_ib_move_work: the RTR of the new QPs, which
 *     on RoCE resolves the peer's address in the kernel, up to a second);
 *   - a timer, for the comms that need one only: a move under way or lost
 *     pieces still to write (every TICK_NS until done), and a comm away
 *     from home (when its home's hold-down ends).
 * An idle comm costs no wake-up. A look takes the comm (the guard,
 * transport.h; one membarrier for the whole batch of a round); one NCCL is
 * in a call on, or has called within a tick, is left to NCCL's calls,
 * which drive its move, and looked at again a tick later; unless its move
 * stays wanted for UNDRIVEN_NS while it is called (calls that drive no
 * move, such as an iflush with nothing to flush): then the thread drives
 * it too, a step a tick. The work runs
 * one item at a time, outside the comm's guard.
 *
 * Locking: mt.lock guards the table, each entry's work and later, and the
 * eventfd; it is not held while a comm is looked at or its work runs, so
 * connect and close never wait for a move. An entry's other fields are the
 * thread's (NCCL's thread writes due only holding the comm's guard, as the
 * thread does when it looks). A comm's entry lives until it unregisters;
 * the thread frees it after its round, so no epoll event points to freed
 * memory.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "thread.h"

#define TICK_NS (20ull * 1000000ull)	/* a comm with a move to drive: looked at this often */
/* A move NCCL's calls leave undriven this long (calls that do not drive one) is the thread's. */
#define UNDRIVEN_NS (200ull * 1000000ull)
#define EVENTS 64

enum { W_NONE, W_QUEUED, W_RUNNING };

struct rail_ib_mt {
	struct rail_ib_comm *c;		/* NULL: unregistered, freed after the round */
	struct rail_ib_mt *dead_next;
	_Atomic uint64_t due;		/* look at it then (rail_now_ns); 0: on an event only */
	unsigned seen_calls;		/* base.calls, as first seen ... */
	uint64_t seen_ns;		/* ... then */
	uint64_t wanted_ns;		/* a move wanted since then (0: none) */
	int flagged;			/* an event for it: looked at in the next round */
	int armed;			/* its socket waits in the epoll set */
	int sock_gone;			/* end of file or an error there: not watched again */
	int work;			/* W_*, with fn (mt.lock) */
	void (*fn)(struct rail_ib_comm *c);
	void (*later)(struct rail_ib_comm *c);	/* closed while its work ran (mt.lock) */
	void (*closing)(struct rail_ib_comm *c);	/* closed with a move to finish: then this */
	uint64_t close_end;		/* ... given up then */
	int finish;			/* the look found it settled: closing(c) after the round's look */
	int swept;			/* the sweep asks a look of the stall watchdog only */
	int probed;			/* ... which posted a probe: polled at the round's end */
	unsigned sweep_calls;		/* base.calls at the last sweep ... */
	uint64_t stall_last;		/* ... and the last look of the stall watchdog here */
};

static struct {
	pthread_mutex_t lock;
	pthread_t thread;
	int started, stop;
	int ep, evfd;
	int scan;			/* an async event: look at every comm once */
	uint64_t sweep_ns;		/* the next sweep (the stall watchdog of comms NCCL left) */
	int n, cap;
	struct rail_ib_mt **v;
	struct rail_ib_mt *dead;
	/* the thread's round (grown under the lock, used without it) */
	int bcap;
	struct rail_ib_mt **batch;
	struct rail_comm **comms;
	unsigned char *taken;
	atomic_ullong loops;
	atomic_int woken;		/* a quiet comm called again: the eventfd written */
} mt = { .lock = PTHREAD_MUTEX_INITIALIZER, .ep = -1, .evfd = -1 };

/* Wake the thread (mt.lock held, or the thread running: mt.evfd stays open). */
static void kick(void)
{
	uint64_t one = 1;

	if (mt.evfd >= 0 && write(mt.evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		RAIL_WARN("move thread: write(eventfd) failed: %s", RAIL_ERRSTR(-errno));
}

/* The async threads' hook: an event that may start or end moves. */
static void on_async(void)
{
	pthread_mutex_lock(&mt.lock);
	mt.scan = 1;
	kick();
	pthread_mutex_unlock(&mt.lock);
}

/*
 * NCCL's call on a quiet comm (rail_comm_woken, any thread, no lock): one
 * eventfd write for any number of them until the thread wakes; the thread
 * then sweeps again (the quiet flags it reads come with the exchange).
 */
static void on_woken(void)
{
	if (!atomic_exchange(&mt.woken, 1))
		kick();
}

/* Its socket back in the epoll set (one-shot): the next bytes wake the thread. */
static void arm(struct rail_ib_mt *e)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = e };

	if (epoll_ctl(mt.ep, EPOLL_CTL_MOD, e->c->oob_fd, &ev) == 0)
		e->armed = 1;
	else
		e->sock_gone = 1;	/* NCCL's calls find what is wrong with it */
}

/* A sender with pieces a move lost still to write again, CTS by CTS as they come. */
static int pieces_left(const struct rail_ib_comm *c)
{
	return c->base.kind == RAIL_COMM_SEND && (c->rp_next != c->rp_end || c->batch_stale);
}

/*
 * One look at c, holding its guard (mt.lock not held). NCCL called it in
 * the last TICK_NS (as far as the looks tell): its calls drive what there
 * is to drive, and the thread only watches. Else the thread drives its
 * move, or its lost pieces. Then: when to look again, and its socket armed
 * again once it is idle.
 */
/* ---- a close with a move to finish (ib.h, RAIL_IB_SETTLE_NS) -------------- */

int rail_ib_move_settle_step(struct rail_ib_comm *c, const char *call)
{
	if (!c->back.off) {	/* closing: no probe, no move back from now on */
		rail_ib_probe_stop(c);
		c->back.off = 1;
		c->back.due = 0;
		c->back.verified_ns = 0;
	}
	if (!rail_ib_move_close_due(c) || rail_ib_oob_peek(c))
		return 1;	/* nothing left, or the peer closed: nothing to finish with it */
	if (rail_ib_move_due(c))
		(void)c->on_move(c, rail_ib_move_failure_trigger(c), call);
	else
		(void)rail_ib_send_progress(c);
	return 0;
}

int rail_ib_move_settle(struct rail_ib_comm *c, const char *call)
{
	uint64_t end = rail_now_ns() + RAIL_IB_SETTLE_NS;

	while (!rail_ib_move_settle_step(c, call)) {
		if (rail_now_ns() > end) {
			rail_ib_move_settle_late(c, call);
			return -ETIMEDOUT;
		}
	}
	return c->error;
}

/* A comm NCCL closed with a move to finish: one step; settled, it is finished after the look. */
static void look_closing(struct rail_ib_mt *e, uint64_t now)
{
	int done = rail_ib_move_settle_step(e->c, "close");

	if (!done && now > e->close_end) {
		rail_ib_move_settle_late(e->c, "close");
		done = 1;
	}
	e->finish = done;
	atomic_store_explicit(&e->due, done ? 0 : now + TICK_NS, memory_order_relaxed);
}

static void quiet_set(struct rail_ib_comm *c)
{
	atomic_store_explicit(&c->base.quiet,
			      c->error || !c->failover || (!c->fencing && rail_ib_stall_quiet(c)),
			      memory_order_relaxed);	/* NCCL's next call sees it (the guard) */
}

/*
 * A sweep's look (nothing else due): the stall watchdog of a comm NCCL has
 * not called since the last sweep; 1 when the comm needs the full look (the
 * watchdog fired). No system call unless the watchdog acts: an idle comm's
 * socket waits in the epoll set. A comm with nothing left to watch is
 * quiet: no sweep looks at it until NCCL calls it again.
 */
static int look_stall(struct rail_ib_mt *e, uint64_t now)
{
	struct rail_ib_comm *c = e->c;

	if (c->mv || c->path_failed)
		return 0;
	if (!c->error) {
		/* its writes owed, NCCL not calling */
		e->probed = rail_ib_stall_look(c, e->stall_last, e->armed && !e->sock_gone);
		e->stall_last = now;
	}
	if (c->path_failed)
		return 1;
	quiet_set(c);
	return 0;
}

/*
 * A probe posted in this round has had the round's other looks to complete
 * (microseconds on a healthy path): polled now, the comm is quiet at once,
 * not a stall timeout later. Still held; given back here.
 */
static void probe_end(struct rail_ib_mt *e, struct rail_comm *held)
{
	struct rail_ib_comm *c = e->c;

	e->probed = 0;
	if (!rail_ib_poll(c) && !c->path_failed)
		quiet_set(c);
	rail_guard_give(held);
}

static void look(struct rail_ib_mt *e, uint64_t now)
{
	struct rail_ib_comm *c = e->c;
	unsigned calls = atomic_load_explicit(&c->base.calls, memory_order_relaxed);
	int called, wanted, busy, swept = e->swept;
	uint64_t due = 0;

	e->swept = 0;
	atomic_store_explicit(&c->base.quiet, 0, memory_order_relaxed);
	if (e->closing) {
		look_closing(e, now);
		return;
	}
	if (swept && !look_stall(e, now))
		return;	/* the sweep only: nothing else was due (due and armed unchanged) */
	wanted = !c->error && rail_ib_move_wanted(c);
	if (calls != e->seen_calls) {
		e->seen_calls = calls;
		e->seen_ns = now;
	}
	called = now - e->seen_ns < TICK_NS;
	e->wanted_ns = !wanted ? 0 : e->wanted_ns ? e->wanted_ns : now;
	/*
	 * Called, yet wanted for UNDRIVEN_NS: the calls do not drive it (an
	 * iflush with nothing to flush reads no MOVE), so the thread does, once
	 * a tick, under the guard like any look.
	 */
	if (wanted && (!called || now - e->wanted_ns >= UNDRIVEN_NS))
		(void)c->on_move(c, rail_ib_move_trigger(c), "the move thread");
	if (!called && !c->mv && !c->error && pieces_left(c))
		(void)rail_ib_send_progress(c);
	busy = c->mv || c->path_failed || pieces_left(c) || (called && wanted);
	if (!c->error) {
		due = busy ? now + TICK_NS : rail_ib_move_next_ns(c);
		if (due && due <= now)
			due = now + TICK_NS;	/* home is ready but the move did not start */
	}
	atomic_store_explicit(&e->due, due, memory_order_relaxed);
	if (!c->error && !busy && !e->armed && !e->sock_gone)
		arm(e);
}

static int grow_batch(void)
{
	int cap = mt.cap;
	void *b, *cm, *t;

	if (mt.bcap >= cap)
		return 0;
	b = realloc(mt.batch, (size_t)cap * sizeof(*mt.batch));
	if (b)
		mt.batch = b;
	cm = realloc(mt.comms, (size_t)cap * sizeof(*mt.comms));
	if (cm)
		mt.comms = cm;
	t = realloc(mt.taken, (size_t)cap);
	if (t)
		mt.taken = t;
	if (!b || !cm || !t)
		return -ENOMEM;
	mt.bcap = cap;
	return 0;
}

/* Look at every comm flagged or due (all of them after an async event). mt.lock held. */
static void round_run(uint64_t now)
{
	int n = 0, scan = mt.scan;

	int nomem = grow_batch();

	mt.scan = 0;
	for (int i = 0; i < mt.n; i++) {
		struct rail_ib_mt *e = mt.v[i];
		uint64_t due = atomic_load_explicit(&e->due, memory_order_relaxed);

		if (e->later || e->work != W_NONE)
			continue;	/* closed, or its work queued or running */
		if (!scan && !e->flagged && !(due && due <= now) && !e->swept)
			continue;
		if (scan || e->flagged || (due && due <= now))
			e->swept = 0;	/* a full look */
		e->flagged = 0;
		if (nomem) {	/* this round is lost: NCCL's calls move these comms */
			atomic_store_explicit(&e->due, now + TICK_NS, memory_order_relaxed);
			continue;
		}
		mt.batch[n] = e;
		mt.comms[n++] = &e->c->base;
	}
	if (!n)
		return;
	rail_guard_take(mt.comms, n, mt.taken);
	for (int i = 0; i < n; i++)	/* NCCL is in a call on it: again in a tick */
		if (!mt.taken[i]) {
			atomic_store_explicit(&mt.batch[i]->due, now + TICK_NS, memory_order_relaxed);
			mt.batch[i]->swept = 0;	/* else the next round tries at once, and again */
		}
	pthread_mutex_unlock(&mt.lock);
	for (int i = 0; i < n; i++) {
		struct rail_ib_mt *e = mt.batch[i];
		struct rail_ib_comm *c = e->c;

		if (!mt.taken[i])
			continue;
		look(e, now);
		if (e->probed)
			continue;	/* held until its probe is polled, below */
		rail_guard_give(mt.comms[i]);	/* not touched after this: close may free it */
		if (e->finish)
			e->closing(c);	/* frees c (it unregisters: e is freed after the round) */
	}
	for (int i = 0; i < n; i++)
		if (mt.taken[i] && mt.batch[i]->probed)
			probe_end(mt.batch[i], mt.comms[i]);
	pthread_mutex_lock(&mt.lock);
}

/* Take e out of the table (mt.lock held); the thread frees it after its round. */
static void drop(struct rail_ib_mt *e)
{
	for (int i = 0; i < mt.n; i++)
		if (mt.v[i] == e) {
			mt.v[i] = mt.v[--mt.n];
			break;
		}
	e->c->mt = NULL;
	e->c = NULL;
	e->dead_next = mt.dead;
	mt.dead = e;
}

/* The work handed over, each without mt.lock (re-taken between). mt.lock held. */
static void run_work(void)
{
	for (int i = 0; i < mt.n; i++) {
		struct rail_ib_mt *e = mt.v[i];
		struct rail_ib_comm *c = e->c;

		if (e->work != W_QUEUED)
			continue;
		e->work = W_RUNNING;
		pthread_mutex_unlock(&mt.lock);
		e->fn(c);
		pthread_mutex_lock(&mt.lock);
		e->work = W_NONE;
		if (e->later) {
			void (*later)(struct rail_ib_comm *c) = e->later;

			drop(e);	/* closed meanwhile: it is freed now */
			pthread_mutex_unlock(&mt.lock);
			later(c);
			pthread_mutex_lock(&mt.lock);
		} else {
			e->flagged = 1;	/* drive the rest of the move if NCCL does not */
		}
		i = -1;	/* the table may have changed: from the start */
	}
}

static void on_event(const struct epoll_event *ev)
{
	struct rail_ib_mt *e = ev->data.ptr;
	uint64_t n;

	if (!e) {
		if (read(mt.evfd, &n, sizeof(n)) < 0 && errno != EAGAIN)
			RAIL_WARN("move thread: read(eventfd) failed: %s", RAIL_ERRSTR(-errno));
		return;
	}
	if (!e->c)
		return;	/* unregistered after epoll_wait returned */
	e->armed = 0;
	if (ev->events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		e->sock_gone = 1;
	e->flagged = 1;
}

/*
 * Half the stall timeout: how often the comms NCCL has left are swept, while
 * one is not quiet; 0: never.
 */
static uint64_t sweep_every(void)
{
	return (uint64_t)rail_param_int(RAIL_P_IB_STALL_TIMEOUT) * 500000000ull;
}

/*
 * The stall watchdog runs in NCCL's calls; a sender whose last sends
 * completed at post (eager, inline) is not called again, while their writes
 * may sit in a stalled path and its peer waits. Every half stall timeout
 * the comms NCCL has not called since the last sweep are looked at (one
 * wake-up for all of them, one membarrier), and the look runs their
 * watchdog (mt.lock held).
 */
static void sweep(uint64_t now)
{
	if (!mt.sweep_ns || now < mt.sweep_ns)
		return;
	mt.sweep_ns = now + sweep_every();
	for (int i = 0; i < mt.n; i++) {
		struct rail_ib_mt *e = mt.v[i];
		unsigned calls = atomic_load_explicit(&e->c->base.calls, memory_order_relaxed);

		if (atomic_load_explicit(&e->c->base.quiet, memory_order_relaxed))
			continue;	/* called again, it is not: this sweep counts its calls */
		if (calls == e->sweep_calls && !e->closing)
			e->swept = 1;
		e->sweep_calls = calls;
	}
}

/*
 * Milliseconds to the earliest due look, -1 for none (mt.lock held). The
 * sweep's timer runs while a comm is not quiet: started a sweep period
 * from now, stopped when every comm is.
 */
static int timeout_ms(uint64_t now)
{
	uint64_t first = 0;
	int loud = 0;

	if (mt.scan)
		return 0;
	for (int i = 0; i < mt.n; i++) {
		uint64_t due = atomic_load_explicit(&mt.v[i]->due, memory_order_relaxed);

		if (mt.v[i]->work == W_QUEUED || mt.v[i]->flagged || mt.v[i]->swept)
			return 0;
		if (due && !mt.v[i]->later && (!first || due < first))
			first = due;
		loud = loud || !atomic_load_explicit(&mt.v[i]->c->base.quiet, memory_order_relaxed);
	}
	if (!loud || !sweep_every())
		mt.sweep_ns = 0;
	else if (!mt.sweep_ns)
		mt.sweep_ns = now + sweep_every();
	if (mt.sweep_ns && (!first || mt.sweep_ns < first))
		first = mt.sweep_ns;
	if (!first)
		return -1;
	return first <= now ? 0 : (int)RAIL_MIN((first - now + 999999) / 1000000, 60000ull);
}

static void *move_thread(void *arg)
{
	struct epoll_event ev[EVENTS];

	(void)arg;
	rail_thread_name("rail-ib-move");
	pthread_mutex_lock(&mt.lock);
	while (!mt.stop) {
		int n, ms = timeout_ms(rail_now_ns());

		pthread_mutex_unlock(&mt.lock);
		n = epoll_wait(mt.ep, ev, EVENTS, ms);
		(void)atomic_exchange(&mt.woken, 0);	/* every quiet flag cleared before it is seen */
		pthread_mutex_lock(&mt.lock);
		atomic_fetch_add_explicit(&mt.loops, 1, memory_order_relaxed);
		for (int i = 0; i < n; i++)
			on_event(&ev[i]);
		run_work();
		sweep(rail_now_ns());
		round_run(rail_now_ns());
		while (mt.dead) {
			struct rail_ib_mt *e = mt.dead;

			mt.dead = e->dead_next;
			free(e);
		}
	}
	pthread_mutex_unlock(&mt.lock);
	return NULL;
}

/* The thread and its epoll set (mt.lock held): 0, or -errno with the WARN given. */
static int start(void)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	int err;

	mt.ep = epoll_create1(EPOLL_CLOEXEC);
	mt.evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	err = mt.ep < 0 || mt.evfd < 0 || epoll_ctl(mt.ep, EPOLL_CTL_ADD, mt.evfd, &ev) ? -errno : 0;
	if (!err)
		err = -pthread_create(&mt.thread, NULL, move_thread, NULL);
	if (!err) {
		mt.started = 1;
		rail_ib_async_hook_set(on_async);
		rail_comm_wake_set(on_woken);
		return 0;
	}
	RAIL_WARN("no move thread (%s failed: %s): comms move to another path only while NCCL "
		  "calls them", mt.ep < 0 ? "epoll_create1" : mt.evfd < 0 ? "eventfd"
		  : "pthread_create", RAIL_ERRSTR(err));
	if (mt.ep >= 0)
		close(mt.ep);
	if (mt.evfd >= 0)
		close(mt.evfd);
	mt.ep = mt.evfd = -1;
	mt.stop = 1;	/* not tried again */
	return err;
}

void rail_ib_move_register(struct rail_ib_comm *c)
{
	struct rail_ib_mt *e = calloc(1, sizeof(*e));
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = e };

	pthread_mutex_lock(&mt.lock);
	if (!e || (!mt.started && (mt.stop || start())))
		goto out;	/* this comm moves only when NCCL calls it */
	if (mt.n == mt.cap) {
		int cap = mt.cap ? 2 * mt.cap : 64;
		struct rail_ib_mt **v = realloc(mt.v, (size_t)cap * sizeof(*v));

		if (!v)
			goto out;
		mt.v = v;
		mt.cap = cap;
	}
	e->c = c;
	if (epoll_ctl(mt.ep, EPOLL_CTL_ADD, c->oob_fd, &ev) == 0)
		e->armed = 1;
	else
		e->sock_gone = 1;
	mt.v[mt.n++] = e;
	c->mt = e;
	e = NULL;
out:
	pthread_mutex_unlock(&mt.lock);
	free(e);
}

int rail_ib_move_unregister(struct rail_ib_comm *c, void (*later)(struct rail_ib_comm *c))
{
	struct rail_ib_mt *e;

	pthread_mutex_lock(&mt.lock);
	e = c->mt;
	if (!e) {
		pthread_mutex_unlock(&mt.lock);
		return 0;
	}
	if (!e->sock_gone)
		(void)epoll_ctl(mt.ep, EPOLL_CTL_DEL, c->oob_fd, NULL);
	e->sock_gone = 1;
	if (e->work == W_RUNNING) {
		e->later = later;	/* run_work calls it */
		pthread_mutex_unlock(&mt.lock);
		return 1;
	}
	drop(e);	/* its queued work, if any, goes with it */
	pthread_mutex_unlock(&mt.lock);
	return 0;
}

void rail_ib_move_watch(struct rail_ib_comm *c)
{
	uint64_t due = rail_now_ns() + TICK_NS;

	pthread_mutex_lock(&mt.lock);
	if (c->mt) {
		uint64_t old = atomic_load_explicit(&c->mt->due, memory_order_relaxed);

		if (!old || due < old) {
			atomic_store_explicit(&c->mt->due, due, memory_order_relaxed);
			kick();
		}
	}
	pthread_mutex_unlock(&mt.lock);
}

int rail_ib_move_work(struct rail_ib_comm *c, void (*fn)(struct rail_ib_comm *c))
{
	int queued = 0;

	pthread_mutex_lock(&mt.lock);
	if (c->mt && mt.started && !mt.stop) {
		c->mt->work = W_QUEUED;
		c->mt->fn = fn;
		kick();
		queued = 1;
	}
	pthread_mutex_unlock(&mt.lock);
	return queued;
}

int rail_ib_move_close(struct rail_ib_comm *c, void (*finish)(struct rail_ib_comm *c))
{
	int taken = 0;

	pthread_mutex_lock(&mt.lock);
	if (c->mt && mt.started && !mt.stop && !c->mt->later) {
		c->mt->closing = finish;
		c->mt->close_end = rail_now_ns() + RAIL_IB_SETTLE_NS;
		c->mt->flagged = 1;
		kick();
		taken = 1;
	}
	pthread_mutex_unlock(&mt.lock);
	return taken;
}

/* Fini: the closed comms the thread had not finished, settled and finished here. */
static void finish_closing(void)
{
	for (;;) {
		struct rail_ib_comm *c = NULL;
		void (*finish)(struct rail_ib_comm *c) = NULL;

		pthread_mutex_lock(&mt.lock);
		for (int i = 0; i < mt.n && !c; i++)
			if (mt.v[i]->closing) {
				c = mt.v[i]->c;
				finish = mt.v[i]->closing;
				mt.v[i]->closing = NULL;
			}
		pthread_mutex_unlock(&mt.lock);
		if (!c)
			return;
		(void)rail_ib_move_settle(c, "finalize");
		finish(c);
	}
}

uint64_t rail_ib_move_thread_loops(void)
{
	return atomic_load_explicit(&mt.loops, memory_order_relaxed);
}

void rail_ib_move_fini(void)
{
	rail_ib_async_hook_set(NULL);
	rail_comm_wake_set(NULL);
	pthread_mutex_lock(&mt.lock);
	mt.stop = 1;
	kick();
	pthread_mutex_unlock(&mt.lock);
	if (mt.started)
		pthread_join(mt.thread, NULL);
	finish_closing();
	pthread_mutex_lock(&mt.lock);
	while (mt.n)
		drop(mt.v[mt.n - 1]);	/* comms NCCL never closed */
	while (mt.dead) {
		struct rail_ib_mt *e = mt.dead;

		mt.dead = e->dead_next;
		free(e);
	}
	free(mt.v);
	free(mt.batch);
	free(mt.comms);
	free(mt.taken);
	mt.v = mt.batch = NULL;
	mt.comms = NULL;
	mt.taken = NULL;
	mt.n = mt.cap = mt.bcap = 0;
	if (mt.ep >= 0)
		close(mt.ep);
	if (mt.evfd >= 0)
		close(mt.evfd);
	mt.ep = mt.evfd = -1;
	mt.started = mt.stop = mt.scan = 0;
	pthread_mutex_unlock(&mt.lock);
}
