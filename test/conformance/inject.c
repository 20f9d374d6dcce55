/*
 * Conformance suite: fault injection, to prove every scenario can fail.
 *
 * With --inject FAULT the bound table is wrapped by functions that make a
 * correct plugin look broken in one precise way (a corrupt byte, a wrong
 * size, a blocking connect, a swallowed error, a leaked thread, ...).
 * --self-test runs each scenario with the faults it must catch and checks
 * that it FAILs. The wrappers sit where the plugin's own bugs would show:
 * between the suite and the exported table.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"

enum fault {
	F_NONE,
	F_BAD_PROPS,
	F_SLOW_CONNECT,
	F_CORRUPT_BYTE,
	F_SWAP_GROUP,
	F_REPORT_ROOM,
	F_NO_ERROR,
	F_WRITE_AFTER_CLOSE,
	F_REGMR_FAIL,
	F_HIDE_ERROR,
	F_CONNECT_HIDE_ERROR,
	F_LEAK_THREAD,
	F_FLUSH_ERROR,
	F_MUTE_WARN,
	F_OVERRUN,
	F_DATA_RACE,
	F_WRONG_PARENT,
};

static const struct {
	const char *name;
	const char *doc;
} faults[] = {
	[F_NONE] = { "none", "" },
	[F_BAD_PROPS] = { "bad-props", "getProperties reports maxRecvs 9" },
	[F_SLOW_CONNECT] = { "slow-connect", "the first connect call blocks 1.5 s" },
	[F_CORRUPT_BYTE] = { "corrupt-byte", "the last byte of every receive is flipped" },
	[F_SWAP_GROUP] = { "swap-group", "a grouped receive reports parts 0 and 1 swapped" },
	[F_REPORT_ROOM] = { "report-room", "test reports the posted size, not the received one" },
	[F_NO_ERROR] = { "no-error", "a failed receive is reported done with the posted size" },
	[F_WRITE_AFTER_CLOSE] = { "write-after-close",
				  "the last buffer received into is written 30 ms after close" },
	[F_REGMR_FAIL] = { "regmr-fail", "the 20th regMr fails" },
	[F_HIDE_ERROR] = { "hide-error", "test turns errors into 'not done yet'" },
	[F_CONNECT_HIDE_ERROR] = { "connect-hide-error", "connect turns errors into 'retry'" },
	[F_LEAK_THREAD] = { "leak-thread", "init starts a thread that finalize leaves running" },
	[F_FLUSH_ERROR] = { "flush-error", "iflush fails" },
	[F_MUTE_WARN] = { "mute-warn", "WARN lines never reach NCCL's logger" },
	[F_OVERRUN] = { "overrun", "one byte is written after every received message" },
	[F_DATA_RACE] = { "data-race", "init: two threads write one word without a lock (only "
			  "ThreadSanitizer sees it; make test-tsan checks that it does)" },
	[F_WRONG_PARENT] = { "wrong-parent", "isend/irecv hand the plugin a profiler parent of "
			     "their own instead of the caller's (v10+)" },
};

static int fault;
static struct rail_conf_net orig;

int rail_conf_inject_set(const char *name)
{
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) {
		if (!strcmp(name, faults[i].name)) {
			fault = (int)i;
			return 0;
		}
	}
	return -1;
}

void rail_conf_inject_list(FILE *f)
{
	for (size_t i = 1; i < sizeof(faults) / sizeof(faults[0]); i++)
		fprintf(f, "  %-20s %s\n", faults[i].name, faults[i].doc);
}

/* ---- receive requests in flight: req -> buffers (open addressing) ---- */

#define TRACK_SLOTS 16384

struct track {
	void *req;
	int n;
	int dead;		/* hide-error: its error was hidden; never test it again */
	void *data[RAIL_CONF_MAX_RECVS];
	size_t size[RAIL_CONF_MAX_RECVS];
};

static struct track tracked[TRACK_SLOTS];
static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(void *req)
{
	return (size_t)(((uintptr_t)req >> 4) * 0x9e3779b97f4a7c15ull) % TRACK_SLOTS;
}

static void track_add(const struct track *t)
{
	pthread_mutex_lock(&track_lock);
	for (size_t i = slot_of(t->req), k = 0; k < TRACK_SLOTS; k++, i = (i + 1) % TRACK_SLOTS) {
		if (!tracked[i].req || tracked[i].req == t->req) {
			tracked[i] = *t;
			break;
		}
	}
	pthread_mutex_unlock(&track_lock);
}

/* Copy out and forget (remove=1) or just copy out. */
static int track_get(void *req, struct track *out, int remove)
{
	int found = 0;

	pthread_mutex_lock(&track_lock);
	for (size_t i = slot_of(req), k = 0; k < TRACK_SLOTS && tracked[i].req;
	     k++, i = (i + 1) % TRACK_SLOTS) {
		if (tracked[i].req != req)
			continue;
		*out = tracked[i];
		found = 1;
		if (remove) {
			/* Re-insert the rest of the cluster so lookups still find them. */
			size_t j = (i + 1) % TRACK_SLOTS;

			tracked[i].req = NULL;
			while (tracked[j].req) {
				struct track t = tracked[j];

				tracked[j].req = NULL;
				pthread_mutex_unlock(&track_lock);
				track_add(&t);
				pthread_mutex_lock(&track_lock);
				j = (j + 1) % TRACK_SLOTS;
			}
		}
		break;
	}
	pthread_mutex_unlock(&track_lock);
	return found;
}

/* ---- the last buffer posted per receive comm (write-after-close) ---- */

#define LAST_SLOTS 256

static struct {
	void *comm;
	void *data;
} last_posted[LAST_SLOTS];

static void remember_posted(void *comm, void *data)
{
	size_t free_slot = LAST_SLOTS;

	pthread_mutex_lock(&track_lock);
	for (size_t i = 0; i < LAST_SLOTS; i++) {
		if (last_posted[i].comm == comm) {
			free_slot = i;
			break;
		}
		if (!last_posted[i].comm && free_slot == LAST_SLOTS)
			free_slot = i;
	}
	if (free_slot < LAST_SLOTS) {
		last_posted[free_slot].comm = comm;
		last_posted[free_slot].data = data;
	}
	pthread_mutex_unlock(&track_lock);
}

/* ---- wrappers ---- */

static ncclResult_t w_get_props(int dev, struct rail_conf_props *p)
{
	ncclResult_t res = orig.get_props(dev, p);

	if (res == ncclSuccess)
		p->max_recvs = 9;
	return res;
}

static ncclResult_t w_connect(struct rail_conf_net *net, int dev, void *h, void **sc, void **dc)
{
	static int calls;
	ncclResult_t res;

	if (fault == F_SLOW_CONNECT && calls++ == 0)
		rail_conf_sleep_ms(1500);
	res = orig.connect(net, dev, h, sc, dc);
	if (fault == F_CONNECT_HIDE_ERROR && res != ncclSuccess) {
		*sc = NULL;
		return ncclSuccess;
	}
	return res;
}

static ncclResult_t w_irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
			    void **req)
{
	ncclResult_t res = orig.irecv(rc, n, data, sizes, tags, mh, req);

	if (res != ncclSuccess && fault == F_HIDE_ERROR) {
		*req = NULL; /* "retry later", forever */
		return ncclSuccess;
	}
	if (res == ncclSuccess && *req) {
		struct track t = { .req = *req, .n = n };

		for (int i = 0; i < n && i < RAIL_CONF_MAX_RECVS; i++) {
			t.data[i] = data[i];
			t.size[i] = sizes[i];
		}
		track_add(&t);
		if (n > 0 && sizes[0] > 0)
			remember_posted(rc, data[0]);
	}
	return res;
}

static void mangle_done(const struct track *t, int *sizes)
{
	uint8_t *d0 = t->data[0];

	switch (fault) {
	case F_CORRUPT_BYTE:
		if (sizes[0] > 0)
			d0[sizes[0] - 1] ^= 0x01;
		break;
	case F_OVERRUN:
		d0[sizes[0] > 0 ? sizes[0] : 0] ^= 0x80;
		break;
	case F_SWAP_GROUP:
		if (t->n > 1) {
			int s = sizes[0];

			sizes[0] = sizes[1];
			sizes[1] = s;
		}
		break;
	case F_REPORT_ROOM:
		for (int i = 0; i < t->n; i++)
			sizes[i] = (int)t->size[i];
		break;
	default:
		break;
	}
}

static ncclResult_t w_test(void *req, int *done, int *sizes)
{
	struct track t;
	int is_recv = track_get(req, &t, 0);
	ncclResult_t res;

	if (is_recv && t.dead) {
		*done = 0;
		return ncclSuccess;
	}
	res = orig.test(req, done, sizes);
	if (!is_recv)
		return res;
	if (res != ncclSuccess && fault == F_HIDE_ERROR) {
		/* The real request is gone; keep answering "not yet" for it. */
		t.dead = 1;
		track_add(&t);
		*done = 0;
		return ncclSuccess;
	}
	if (res != ncclSuccess && fault == F_NO_ERROR) {
		track_get(req, &t, 1);
		*done = 1;
		for (int i = 0; sizes && i < t.n; i++)
			sizes[i] = (int)t.size[i];
		return ncclSuccess;
	}
	if (res == ncclSuccess && *done) {
		track_get(req, &t, 1);
		if (sizes)
			mangle_done(&t, sizes);
	}
	return res;
}

static void *late_writer(void *p)
{
	rail_conf_sleep_ms(30);
	*(volatile uint8_t *)p ^= 1;
	return NULL;
}

static ncclResult_t w_close_recv(void *rc)
{
	ncclResult_t res = orig.close_recv(rc);
	void *data = NULL;
	pthread_t th;

	/*
	 * The last buffer posted on the comm, whether its receive completed
	 * or not: every receive may have finished before the close, and the
	 * fault must fire all the same.
	 */
	pthread_mutex_lock(&track_lock);
	for (size_t i = 0; i < LAST_SLOTS; i++) {
		if (last_posted[i].comm == rc) {
			data = last_posted[i].data;
			last_posted[i].comm = NULL;
		}
	}
	pthread_mutex_unlock(&track_lock);
	if (data && !pthread_create(&th, NULL, late_writer, data))
		pthread_detach(th);
	return res;
}

static ncclResult_t w_reg_mr(void *comm, void *data, size_t size, int type, void **mh)
{
	static int calls;

	if (__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) == 20)
		return ncclSystemError;
	return orig.reg_mr(comm, data, size, type, mh);
}

static void *sleeper(void *p)
{
	(void)p;
	for (;;)
		pause();
	return NULL;
}

static void mute_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
			const char *fmt, ...)
{
	(void)level;
	(void)flags;
	(void)file;
	(void)line;
	(void)fmt;
}

/* Written by two threads without a lock: a race only a race detector sees. */
static volatile int race_word;

static void *racer(void *arg)
{
	(void)arg;
	race_word = race_word + 1;
	return NULL;
}

static void data_race(void)
{
	pthread_t th;

	if (pthread_create(&th, NULL, racer, NULL))
		return;
	race_word = race_word + 1;
	pthread_join(th, NULL);
}

static ncclResult_t w_init(struct rail_conf_net *net, ncclDebugLogger_t logger)
{
	ncclResult_t res = orig.init(net, fault == F_MUTE_WARN ? mute_logger : logger);
	pthread_t th;

	if (fault == F_LEAK_THREAD && res == ncclSuccess && !pthread_create(&th, NULL, sleeper, NULL))
		pthread_detach(th);
	if (fault == F_DATA_RACE)
		data_race();
	return res;
}

static ncclResult_t w_iflush(void *rc, int n, void **data, int *sizes, void **mh, void **req)
{
	(void)rc;
	(void)n;
	(void)data;
	(void)sizes;
	(void)mh;
	(void)req;
	return ncclSystemError;
}

static char stray_parent;

static ncclResult_t w_isend_ph(void *sc, void *d, size_t size, int tag, void *mh, void *ph,
			       void **req)
{
	return orig.isend_ph(sc, d, size, tag, mh, ph ? &stray_parent : NULL, req);
}

static ncclResult_t w_irecv_ph(void *rc, int n, void **d, size_t *sizes, int *tags, void **mh,
			       void **ph, void **req)
{
	void *mine[RAIL_CONF_MAX_RECVS];

	for (int i = 0; i < n && i < RAIL_CONF_MAX_RECVS; i++)
		mine[i] = ph && ph[i] ? &stray_parent : NULL;
	return orig.irecv_ph(rc, n, d, sizes, tags, mh, ph ? mine : NULL, req);
}

void rail_conf_inject_apply(struct rail_conf_net *net)
{
	if (fault == F_NONE)
		return;
	orig = *net;
	net->irecv = w_irecv;
	net->test = w_test;
	net->connect = w_connect;
	net->init = w_init;
	switch (fault) {
	case F_BAD_PROPS: net->get_props = w_get_props; break;
	case F_WRITE_AFTER_CLOSE: net->close_recv = w_close_recv; break;
	case F_REGMR_FAIL: net->reg_mr = w_reg_mr; break;
	case F_FLUSH_ERROR: net->iflush = w_iflush; break;
	case F_WRONG_PARENT:
		if (net->isend_ph) {
			net->isend_ph = w_isend_ph;
			net->irecv_ph = w_irecv_ph;
		}
		break;
	default: break;
	}
}
