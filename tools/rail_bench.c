/*
 * rail-bench: latency and bandwidth of the plugin between two processes.
 *
 *   rail-bench [options]                       two processes on this host (fork)
 *   rail-bench --server [ADDR:]PORT [options]  one side of a two-host run
 *   rail-bench --client HOST:PORT [options]    the other side; its options
 *                                              are the run's (the server adopts them)
 *
 * Both processes use the plugin's version-neutral API (the same code NCCL
 * reaches through the ABI shims), with the transport chosen as the plugin
 * chooses it (NCCL_RAIL_TRANSPORT). Latency is half the round trip of a
 * ping-pong; bandwidth is one direction with a window of messages in
 * flight, like NCCL's pipelined steps. --total moves a given number of
 * bytes instead of the size sweep, and --verify checks every byte of it.
 * --csv FILE writes the sweep's rows to FILE too, for plotting.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "log.h"
#include "rail.h"
#include "sock.h"
#include "wire.h"

#include "rail_bench/bench.h"

static const char *result_text(ncclResult_t r)
{
	switch (r) {
	case ncclRemoteError:
		return "the peer failed, or the network between the hosts dropped the connection";
	case ncclSystemError:
		return "a system or device error on this host";
	case ncclInvalidUsage:
	case ncclInvalidArgument:
		return "rail-bench asked for something the transport does not allow";
	default:
		return "an internal error in the plugin";
	}
}

/* what: the step in the user's words ("connecting to the peer"). */
#define CHECK(call, what)                                                              \
	do {                                                                           \
		ncclResult_t r_ = (call);                                              \
		if (r_ != ncclSuccess) {                                               \
			fprintf(stderr, "rail-bench: %s failed: %s (the plugin's "     \
				"warnings above say more)\n", (what), result_text(r_)); \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

static double secs_since(uint64_t t0)
{
	return (double)(rail_now_ns() - t0) / 1e9;
}

/* ncomms connections in each direction, all through one listen comm. */
static void connect_all(struct bench_side *s, int dev, double timeout)
{
	char mine[NCCL_NET_HANDLE_MAXSIZE], theirs[NCCL_NET_HANDLE_MAXSIZE];
	struct rail_handle ph;
	char why[128];
	void *lc = NULL;
	uint64_t t0 = rail_now_ns();

	CHECK(rail_net_listen(s->ctx, dev, mine, &lc), "listening for the peer's data connections");
	bench_oob_xchg(s->oob, mine, theirs, sizeof(mine));
	if (rail_handle_decode(theirs, sizeof(theirs), &ph, why, sizeof(why)) == 0)
		rail_sockaddr_str(&ph.addr, s->peer_data, sizeof(s->peer_data));
	else
		snprintf(s->peer_data, sizeof(s->peer_data), "(unreadable: %s)", why);
	for (int c = 0; c < s->ncomms; c++) {
		char h[NCCL_NET_HANDLE_MAXSIZE];

		memcpy(h, theirs, sizeof(h));
		while (!s->send[c] || !s->recv[c]) {
			if (!s->send[c])
				CHECK(rail_net_connect(s->ctx, dev, -1, h, &s->send[c]),
				      "connecting to the peer's data address");
			if (!s->recv[c])
				CHECK(rail_net_accept(lc, &s->recv[c]),
				      "accepting the peer's data connection");
			if (s->send[c] && s->recv[c])
				break;
			if (secs_since(t0) > timeout) {
				fprintf(stderr, "rail-bench: the data connections with the peer did "
					"not complete within %.0f s (its data address is %s: is it "
					"reachable from here? NCCL_SOCKET_IFNAME picks the interface "
					"on each side, NCCL_IB_HCA the RDMA device)\n", timeout,
					s->peer_data);
				exit(1);
			}
			usleep(100);
		}
	}
	CHECK(rail_net_close_listen(lc), "closing the listener");
}

/* ---- data pattern (--verify) ----------------------------------------- */

/* Byte i of message msg: depends on the offset and on the message number. */
static inline uint64_t pattern_word(uint64_t msg, uint64_t word)
{
	return ((msg << 32) ^ word) * 0x9e3779b97f4a7c15ull + msg;
}

static void pattern_fill(unsigned char *b, size_t size, uint64_t msg)
{
	size_t i = 0;

	for (; i + 8 <= size; i += 8) {
		uint64_t v = pattern_word(msg, i / 8);

		memcpy(b + i, &v, 8);
	}
	if (i < size) {
		uint64_t v = pattern_word(msg, i / 8);

		memcpy(b + i, &v, size - i);
	}
}

/* The offset of the first wrong byte, or size when all are right. */
static size_t pattern_check(const unsigned char *b, size_t size, uint64_t msg)
{
	unsigned char want[8];
	size_t i = 0;

	for (; i + 8 <= size; i += 8) {
		uint64_t v = pattern_word(msg, i / 8);

		if (memcmp(b + i, &v, 8))
			break;
	}
	for (; i < size; i++) {
		uint64_t v = pattern_word(msg, i / 8);

		memcpy(want, &v, 8);
		if (b[i] != want[i % 8])
			return i;
	}
	return size;
}

/* ---- latency --------------------------------------------------------- */

static void wait_req(void *req, int *size)
{
	int done = 0;

	while (!done)
		CHECK(rail_net_test(req, &done, size), "waiting for a transfer");
}

/*
 * --profiler: what NCCL 2.26+ does with the profiler hooks. "none": no
 * callback, no parent handles (older NCCL). "idle": a callback that starts
 * no event and a parent per transfer, as NCCL with no profiler plugin
 * loaded. "events": a callback that starts and stops events (a profiler
 * recording every net plugin event, at no cost of its own).
 */
enum { PROF_NONE, PROF_IDLE, PROF_EVENTS };
static int bench_prof;
static int bench_parent;	/* a parent handle's address; never read */
static _Atomic long bench_prof_events;

static ncclResult_t bench_prof_cb(void **ev, int type, void *parent, int64_t id, void *descr)
{
	(void)parent;
	(void)id;
	(void)descr;
	if (bench_prof == PROF_EVENTS && type == 0) {
		*ev = &bench_parent;
		bench_prof_events++;
	}
	return ncclSuccess;
}

static void *prof_parent(void)
{
	return bench_prof == PROF_NONE ? NULL : &bench_parent;
}

static void **prof_parents(void)
{
	static void *one[1] = { &bench_parent };

	return bench_prof == PROF_NONE ? NULL : one;
}

static void *post_send(struct bench_side *s, int c, size_t size)
{
	void *req = NULL;

	while (!req)
		CHECK(rail_net_isend_ph(s->send[c], s->sbuf, size, s->role, s->smh[c],
					prof_parent(), &req),
		      "posting a send");
	return req;
}

static void *post_recv(struct bench_side *s, int c, char *buf, size_t size)
{
	void *req = NULL, *data = buf;
	int tag = !s->role;

	while (!req)
		CHECK(rail_net_irecv_ph(s->recv[c], 1, &data, &size, &tag, &s->rmh[c],
					prof_parents(), &req),
		      "posting a receive");
	return req;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Half round trip, in microseconds: the mean, and the median in *p50 (if not
 * NULL). Each side keeps its next receive posted while it waits for the
 * current one, as NCCL's proxy posts receives ahead of the data: the time
 * from a message's arrival to the answer's isend holds no irecv.
 */
static double bench_latency(struct bench_side *s, size_t size, int iters, double *p50)
{
	uint64_t *rtt = p50 ? calloc((size_t)iters, sizeof(*rtt)) : NULL;
	uint64_t t0 = rail_now_ns(), t = t0;
	void *rr = post_recv(s, 0, s->rbuf, size);

	for (int i = 0; i < iters; i++) {
		void *next = NULL;
		uint64_t now;

		if (s->role == 0) {
			void *sr = post_send(s, 0, size);

			if (i + 1 < iters)
				next = post_recv(s, 0, s->rbuf, size);
			wait_req(sr, NULL);
			wait_req(rr, NULL);
		} else {
			wait_req(rr, NULL);
			wait_req(post_send(s, 0, size), NULL);
			if (i + 1 < iters)
				next = post_recv(s, 0, s->rbuf, size);
		}
		rr = next;
		now = rail_now_ns();
		if (rtt)
			rtt[i] = now - t;
		t = now;
	}
	if (rtt) {
		qsort(rtt, (size_t)iters, sizeof(*rtt), cmp_u64);
		*p50 = (double)rtt[iters / 2] / 1e3 / 2;
		free(rtt);
	} else if (p50) {
		*p50 = 0;
	}
	return (double)(t - t0) / 1e3 / iters / 2;
}

/* ---- bandwidth and --total ------------------------------------------- */

/*
 * A sends and B receives (both ways with bidir) on every comm, each with
 * `window` messages in flight. Like NCCL's proxy: each stream (a comm, one
 * direction) posts in order what its window allows (a refused post is
 * retried on a later pass, not spun on) and tests only its oldest request.
 * Message j of the lane on comm c is message j * ncomms + c of the run
 * (the --verify pattern's message number).
 */
struct bw_lane {
	int is_send, comm;
	int iters;
	int posted, done;
	void *req[BENCH_MAX_WINDOW];	/* [done, posted) in flight, by index % window */
};

struct bw_run {
	size_t size;
	int window, verify;
	uint64_t bad_msgs, first_bad;	/* verify: wrong messages, first wrong byte of the run */
	uint64_t checked;		/* verify: bytes checked */
	uint64_t corrupt;		/* 1 + the stream offset the sender flips, or 0 */
	double timeout;
};

static char *lane_buf(struct bench_side *s, const struct bw_lane *l, const struct bw_run *r,
		      int idx)
{
	size_t slot = ((size_t)l->comm * (size_t)r->window + (size_t)(idx % r->window)) * r->size;

	if (!l->is_send)
		return (char *)s->rbuf + slot;
	return r->verify ? (char *)s->sbuf + slot : s->sbuf;
}

/* One attempt, as NCCL's proxy makes per pass: NULL when the plugin says "later". */
static void *try_post(struct bench_side *s, int is_send, int c, char *buf, size_t size)
{
	void *req = NULL, *data = buf;
	int tag = !s->role;

	if (is_send)
		CHECK(rail_net_isend_ph(s->send[c], buf, size, s->role, s->smh[c], prof_parent(),
					&req),
		      "posting a send");
	else
		CHECK(rail_net_irecv_ph(s->recv[c], 1, &data, &size, &tag, &s->rmh[c],
					prof_parents(), &req),
		      "posting a receive");
	return req;
}

static void lane_verify(struct bench_side *s, const struct bw_lane *l, struct bw_run *r)
{
	uint64_t msg = (uint64_t)l->done * (uint64_t)s->ncomms + (uint64_t)l->comm;
	size_t bad = pattern_check((unsigned char *)lane_buf(s, l, r, l->done), r->size, msg);

	r->checked += r->size;
	if (bad == r->size)
		return;
	if (r->bad_msgs++ == 0)
		r->first_bad = msg * r->size + bad;
}

static int lane_pass(struct bench_side *s, struct bw_lane *l, struct bw_run *r)
{
	int d = 0;

	while (l->posted < l->iters && l->posted - l->done < r->window) {
		char *buf = lane_buf(s, l, r, l->posted);
		void *req;

		if (r->verify && l->is_send) {
			uint64_t msg = (uint64_t)l->posted * (uint64_t)s->ncomms + (uint64_t)l->comm;
			uint64_t at = r->corrupt - 1 - msg * r->size;

			pattern_fill((unsigned char *)buf, r->size, msg);
			if (r->corrupt && at < r->size)
				buf[at] ^= 0x20;
		}
		req = try_post(s, l->is_send, l->comm, buf, r->size);
		if (!req)
			break;
		l->req[l->posted++ % r->window] = req;
	}
	if (l->done == l->posted)
		return 0;
	CHECK(rail_net_test(l->req[l->done % r->window], &d, NULL), "moving data");
	if (d && r->verify && !l->is_send)
		lane_verify(s, l, r);
	l->done += d;
	return d;
}

static int make_lanes(struct bench_side *s, struct bw_lane *lanes, int bidir, uint64_t msgs)
{
	int nl = 0;

	for (int c = 0; c < s->ncomms; c++) {
		for (int dir = 0; dir < 2; dir++) {
			int is_send = dir == 0;

			if (!bidir && is_send != (s->role == 0))
				continue;
			memset(&lanes[nl], 0, sizeof(lanes[nl]));
			lanes[nl].is_send = is_send;
			lanes[nl].comm = c;
			/* messages c, c + ncomms, ... of msgs */
			lanes[nl++].iters = (int)((msgs + (uint64_t)(s->ncomms - 1 - c)) /
						  (uint64_t)s->ncomms);
		}
	}
	return nl;
}

/* Moves msgs messages of r->size each way that runs; returns the seconds taken. */
static double bench_move(struct bench_side *s, struct bw_run *r, uint64_t msgs, int bidir)
{
	struct bw_lane lanes[2 * BENCH_MAX_COMMS];
	int nl = make_lanes(s, lanes, bidir, msgs), idle = 0;
	uint64_t left = 0, t0, last = 0;

	for (int i = 0; i < nl; i++)
		left += (uint64_t)lanes[i].iters;
	bench_oob_barrier(s->oob);
	t0 = rail_now_ns();
	while (left > 0) {
		int progressed = 0;

		for (int i = 0; i < nl; i++) {
			int d = lane_pass(s, &lanes[i], r);

			left -= (uint64_t)d;
			progressed |= d;
		}
		/*
		 * Give the CPU away when nothing moved (as NCCL's proxy thread
		 * does), and nap when nothing moved for a while: with large
		 * messages the helpers and the kernel need the cores, not us.
		 */
		idle = progressed ? 0 : idle + 1;
		if (idle == 1)
			last = rail_now_ns();
		if (idle > 64)
			usleep(idle > 1024 ? 100 : 20);
		else if (idle)
			sched_yield();
		if (idle > 1024 && (idle & 1023) == 0 && secs_since(last) > r->timeout) {
			fprintf(stderr, "rail-bench: no data moved for %.0f s (%" PRIu64 " messages "
				"still to go): the peer or the network between the hosts stopped\n",
				r->timeout, left);
			exit(1);
		}
	}
	bench_oob_barrier(s->oob);
	return secs_since(t0);
}

/* GB/s of one direction, all comms. */
static double bench_bandwidth(struct bench_side *s, size_t size, int iters, int window, int bidir,
			      double timeout)
{
	struct bw_run r = { .size = size, .window = window, .timeout = timeout };
	double t = bench_move(s, &r, (uint64_t)iters * (uint64_t)s->ncomms, bidir);

	return (double)size * iters * s->ncomms / t / 1e9;
}

static int iters_for(const struct bench_opts *o, size_t size)
{
	/* Aim for about o->seconds per size at ~1 GB/s, within [3, iters]. */
	double budget = o->seconds * 1e9 / (double)(size + 4096);
	int n = budget < o->iters ? (int)budget : o->iters;

	return n < 3 ? 3 : n;
}

/* ---- the two sides ----------------------------------------------------- */

/*
 * "device D = ...": the "[D]..." entry of the transport's device summary
 * (without the ":0" port of an address), and the summary's tail after ';'.
 */
static void device_text(int dev, const char *devs, char *out, size_t len)
{
	char tag[16], *z;
	const char *p, *end, *tail = strchr(devs, ';');
	struct rail_props props;
	int n = snprintf(tag, sizeof(tag), "[%d]", dev);

	p = strstr(devs, tag);
	if (!p || (tail && p > tail)) {
		if (rail_net_get_properties(dev, &props) == ncclSuccess)
			snprintf(out, len, "device %d = %s, %d Mbps", dev, props.name, props.speed);
		else
			snprintf(out, len, "device %d", dev);
		return;
	}
	p += n;
	end = strstr(p, " [");
	if (!end || (tail && end > tail))
		end = tail ? tail : p + strlen(p);
	snprintf(out, len, "device %d = %.*s%s%s%s", dev, (int)(end - p), p, tail ? " (" : "",
		 tail ? tail + 2 : "", tail ? ")" : "");
	for (z = strstr(out, ":0"); z; z = strstr(z + 1, ":0"))
		if (z[2] == ' ' || z[2] == ')' || z[2] == '\0')
			memmove(z, z + 2, strlen(z + 2) + 1);
}

static void print_header(const struct bench_side *s, const struct bench_opts *o, const char *name,
			 const char *why, const char *dev, const struct bench_hello *peer)
{
	const char *me = !s->across ? "this process" : s->role == 0 ? "server" : "client";
	const char *them = !s->across ? "forked peer" : s->role == 0 ? "client" : "server";
	char host[64] = "?";

	gethostname(host, sizeof(host) - 1);
	printf("# rail-bench (nccl-net-rail %s)\n", RAIL_VERSION_STRING);
	printf("# transport: %s, chosen because %s\n", name, why);
	printf("# %s (this side, host %s): %s\n", me, host, dev);
	printf("# %s (%s, host %s): nccl-net-rail %s, %s, %s; data address %s\n", them,
	       s->peer_addr, peer->str.host, peer->str.version, peer->str.transport, peer->str.dev, s->peer_data);
	if (o->total)
		printf("# moving %" PRIu64 " bytes %s as %" PRIu64 " messages of %zu bytes, %d "
		       "connection(s), window %d%s\n", o->total,
		       o->bidir ? "each way" : s->role == 0 ? "to the peer" : "from the peer",
		       o->total / o->msg, o->msg, o->comms, o->window,
		       o->verify ? ", every byte verified" : "");
	fflush(stdout);
}

static void alloc_bufs(struct bench_side *s, const struct bench_opts *o)
{
	size_t size = o->total ? o->msg : o->max_size;

	s->rlen = size * (size_t)o->window * (size_t)o->comms;
	s->slen = o->total && o->verify ? s->rlen : size;
	if (posix_memalign(&s->sbuf, 4096, s->slen) || posix_memalign(&s->rbuf, 4096, s->rlen)) {
		fprintf(stderr, "rail-bench: cannot allocate %zu bytes of buffers: use a smaller "
			"message size, window or connection count\n", s->slen + s->rlen);
		exit(1);
	}
	memset(s->sbuf, 0, s->slen);
	memset(s->rbuf, 0, s->rlen);
}

static void setup_side(struct bench_side *s, struct bench_opts *o)
{
	char why[512], devs[1024], dev[256];
	struct bench_hello peer;
	const char *name = "?";
	int ndev = 0;

	CHECK(rail_net_init(&s->ctx, 0x7261696c, -1, NULL, 12),
	      "starting the plugin (rail-info explains what it found)");
	if (bench_prof != PROF_NONE)
		rail_net_profiler(bench_prof_cb);
	rail_net_transport_info(&name, why, sizeof(why), devs, sizeof(devs));
	CHECK(rail_net_devices(&ndev), "counting devices");
	if (s->dev < 0 || s->dev >= ndev) {
		fprintf(stderr, "rail-bench: there is no device %d: the %s transport has %d on this "
			"host (0..%d; rail-info lists them)\n", s->dev, name, ndev, ndev - 1);
		exit(1);
	}
	device_text(s->dev, devs, dev, sizeof(dev));
	bench_hello_exchange(s, o, name, dev, &peer);
	s->ncomms = o->comms;
	connect_all(s, s->dev, o->timeout);
	if (s->role == 0 || s->across)
		print_header(s, o, name, why, dev, &peer);
	alloc_bufs(s, o);
	for (int c = 0; c < s->ncomms; c++) {
		CHECK(rail_net_reg_mr(s->send[c], s->sbuf, s->slen, NCCL_PTR_HOST, &s->smh[c]),
		      "registering the send buffer");
		CHECK(rail_net_reg_mr(s->recv[c], s->rbuf, s->rlen, NCCL_PTR_HOST, &s->rmh[c]),
		      "registering the receive buffer");
	}
}

static void teardown_side(struct bench_side *s)
{
	for (int c = 0; c < s->ncomms; c++) {
		CHECK(rail_net_dereg_mr(s->send[c], s->smh[c]), "releasing a buffer");
		CHECK(rail_net_dereg_mr(s->recv[c], s->rmh[c]), "releasing a buffer");
		CHECK(rail_net_close_send(s->send[c]), "closing a connection");
		CHECK(rail_net_close_recv(s->recv[c]), "closing a connection");
	}
	CHECK(rail_net_finalize(s->ctx), "stopping the plugin");
	free(s->sbuf);
	free(s->rbuf);
}

/* --csv: the sweep's rows, opened before the run (NULL: none). */
static FILE *bench_csv;

/* One row of the sweep as CSV; a figure not measured (-L, -B) is an empty field. */
static void csv_row(const struct bench_opts *o, size_t size, int iters, double lat, double bw,
		    double p50)
{
	if (!bench_csv)
		return;
	fprintf(bench_csv, "%zu,%d,", size, iters);
	if (!o->bw_only)
		fprintf(bench_csv, "%.3f", lat);
	fputc(',', bench_csv);
	if (!o->lat_only)
		fprintf(bench_csv, "%.6g", bw);
	fputc(',', bench_csv);
	if (!o->bw_only)
		fprintf(bench_csv, "%.3f", p50);
	fputc('\n', bench_csv);
	fflush(bench_csv);	/* a sweep cut short keeps its rows */
}

static void run_sweep(struct bench_side *s, const struct bench_opts *o)
{
	int print = s->role == 0 || s->across;

	if (print)
		printf("# %d connection(s) per direction, window %d, %s, sizes %zu..%zu\n"
		       "#%12s %10s %12s %12s %12s\n", o->comms, o->window,
		       o->bidir ? "bandwidth both ways at once (GB/s per direction)"
				: "bandwidth one way", o->min_size, o->max_size,
		       "size(B)", "iters", "lat(us)", "bw(GB/s)", "lat_p50(us)");
	if (print && bench_csv)	/* the table's columns, in its order */
		fprintf(bench_csv, "size_bytes,iters,lat_us,bw_gbs,lat_p50_us\n");
	for (size_t size = o->min_size; size <= o->max_size; size *= (size_t)o->factor) {
		int iters = iters_for(o, size);
		double lat = 0, bw = 0, p50 = 0;

		if (o->check) {
			size_t bad;

			pattern_fill(s->sbuf, size, size);
			bench_latency(s, size, 1, NULL);
			bad = pattern_check(s->rbuf, size, size);
			if (bad != size) {
				fprintf(stderr, "rail-bench: data mismatch at byte %zu of a %zu-byte "
					"message\n", bad, size);
				exit(1);
			}
		}
		if (!o->bw_only) {
			bench_latency(s, size, o->warmup, NULL);
			lat = bench_latency(s, size, RAIL_MAX(iters / 4, 3), &p50);
		}
		if (!o->lat_only) {
			bench_bandwidth(s, size, RAIL_MIN(o->warmup, iters), o->window, o->bidir,
					o->timeout);
			bw = bench_bandwidth(s, size, iters, o->window, o->bidir, o->timeout);
		}
		if (print) {
			printf(" %12zu %10d %12.2f %12.3f %12.2f\n", size, iters, lat, bw, p50);
			fflush(stdout);
			csv_row(o, size, iters, lat, bw, p50);
		}
		if (size > o->max_size / (size_t)o->factor)
			break;
	}
}

/* --total: move the bytes, verify them, agree with the peer; 0 when all is well. */
static int run_total(struct bench_side *s, const struct bench_opts *o)
{
	struct bw_run r = { .size = o->msg, .window = o->window, .verify = o->verify,
			    .timeout = o->timeout, .corrupt = o->corrupt };
	uint64_t msgs = o->total / o->msg;
	uint8_t mine[24], theirs[24];
	double t = bench_move(s, &r, msgs, o->bidir);
	uint64_t peer_bad, peer_first, peer_checked;

	rail_put_u64(mine, r.bad_msgs), rail_put_u64(mine + 8, r.first_bad);
	rail_put_u64(mine + 16, r.checked);
	bench_oob_xchg(s->oob, mine, theirs, sizeof(mine));
	peer_bad = rail_get_u64(theirs), peer_first = rail_get_u64(theirs + 8);
	peer_checked = rail_get_u64(theirs + 16);
	if (s->role == 0 || s->across) {
		printf("rail-bench: moved %" PRIu64 " bytes%s in %.3f s: %.3f GB/s (%.2f Gbit/s)\n",
		       o->total, o->bidir ? " each way" : "", t, (double)o->total / t / 1e9,
		       (double)o->total * 8 / t / 1e9);
		if (o->verify && !r.bad_msgs && !peer_bad)
			printf("rail-bench: verified: every byte right (%" PRIu64 " bytes checked "
			       "by the receiver)\n", r.checked + peer_checked);
	}
	if (r.bad_msgs)
		fprintf(stderr, "rail-bench: DATA MISMATCH: %" PRIu64 " of the messages received "
			"here were wrong; the first wrong byte is at offset %" PRIu64 " of the "
			"stream\n", r.bad_msgs, r.first_bad);
	if (peer_bad)
		fprintf(stderr, "rail-bench: DATA MISMATCH at the peer: %" PRIu64 " wrong messages, "
			"first wrong byte at offset %" PRIu64 "\n", peer_bad, peer_first);
	return r.bad_msgs || peer_bad;
}

static int run_side(struct bench_side *s, struct bench_opts *o)
{
	int rc = 0;

	setup_side(s, o);
	if (o->total && bench_csv)	/* a server running a client's --total */
		fprintf(stderr, "rail-bench: --csv %s: the run moves --total bytes, not the size "
			"sweep: the file stays empty\n", o->csv);
	if (o->total)
		rc = run_total(s, o);
	else
		run_sweep(s, o);
	if (bench_prof == PROF_EVENTS)
		printf("# profiler events started by this side: %ld\n", (long)bench_prof_events);
	fflush(stdout);
	teardown_side(s);
	return rc;
}

/* ---- command line ---------------------------------------------------- */

static int parse_prof(const char *v)
{
	if (!strcmp(v, "none"))
		return PROF_NONE;
	if (!strcmp(v, "idle"))
		return PROF_IDLE;
	if (!strcmp(v, "events"))
		return PROF_EVENTS;
	fprintf(stderr, "rail-bench: --profiler %s: want none, idle or events\n", v);
	exit(2);
}

/* "4M", "1G", "8192": 0 when it is not a size. */
static size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	switch (*end) {
	case 'k': case 'K': v *= 1024; end++; break;
	case 'm': case 'M': v *= 1024 * 1024; end++; break;
	case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
	}
	if (end == s || *end || v < 1 || v > 1e15)
		return 0;
	return (size_t)v;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: rail-bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
		"                  [-W WINDOW] [-C CONNS] [-x] [-d DEV] [-D PEER_DEV] [-c] [-L|-B]\n"
		"                  [-t SEC] [--total BYTES [--msg BYTES] [--verify]]\n"
		"                  [--server [ADDR:]PORT | --client HOST:PORT] [--timeout SEC]\n"
		"                  [--profiler none|idle|events] [--cpus A,B] [--csv FILE]\n"
		"  -b/-e  smallest/largest message (default 8 and 1G; k/M/G suffixes)\n"
		"  -f     size multiplier per step (default 2)\n"
		"  -n     most iterations per size (default 1000; fewer for large sizes)\n"
		"  -W     messages in flight per connection for bandwidth (default 8, at most 64)\n"
		"  -C     connections per direction, all busy at once (default 1, at most 64)\n"
		"  -x     bandwidth in both directions at once (as in an all-reduce)\n"
		"  -d/-D  device of this process / of the forked peer (default 0/0)\n"
		"  -c     check every byte of one transfer per size\n"
		"  -L/-B  latency only / bandwidth only\n"
		"  -t     time budget per size in seconds at 1 GB/s (default 0.5)\n"
		"  --total BYTES  instead of the size sweep, move BYTES one way (the server sends)\n"
		"  --msg BYTES    message size of --total (default 4M; BYTES a multiple of it)\n"
		"  --verify       check every byte --total moved; exit 1 on any wrong byte\n"
		"  --server [ADDR:]PORT  wait for a client on PORT (every address, or ADDR)\n"
		"  --client HOST:PORT    run against that server; the client's options are the\n"
		"                        run's ([IPv6]:PORT for IPv6 addresses)\n"
		"  --timeout SEC  wait at most SEC for the peer and for progress (default 60)\n"
		"  --profiler M   NCCL's profiler hooks: none (default), idle (a callback that\n"
		"                 starts no event, as NCCL without a profiler plugin), events\n"
		"                 (every event started and stopped)\n"
		"  --cpus A,B     pin this process to CPU A and the forked peer to CPU B (a\n"
		"                 benchmark aid: the same placement as two pinned perftest sides)\n"
		"  --csv FILE     also write the size sweep to FILE as CSV, one row per size:\n"
		"                 size_bytes,iters,lat_us,bw_gbs,lat_p50_us (the table's columns;\n"
		"                 a figure -L or -B leaves out is empty)\n"
		"  --corrupt OFF  (test aid) the sender flips the byte at stream offset OFF\n"
		"  --version      print the version\n"
		"The transport is the plugin's choice: set NCCL_RAIL_TRANSPORT=tcp|ib to force,\n"
		"NCCL_SOCKET_IFNAME for the interface, NCCL_IB_HCA for the RDMA device.\n");
}

/* ---- main ------------------------------------------------------------ */

static int check_opts(const struct bench_opts *o)
{
	const char *bad = NULL;

	if (o->factor < 2)
		bad = "-f must be at least 2";
	else if (o->window < 1 || o->window > BENCH_MAX_WINDOW)
		bad = "-W must be from 1 to 64";
	else if (o->comms < 1 || o->comms > BENCH_MAX_COMMS)
		bad = "-C must be from 1 to 64";
	else if (o->min_size < 1 || o->max_size < o->min_size)
		bad = "-b and -e need sizes with MIN <= MAX (k/M/G suffixes)";
	else if (o->iters < 1)
		bad = "-n must be at least 1";
	else if (o->msg < 1 || o->msg > RAIL_MAX_MSG_BYTES)
		bad = "--msg must be from 1 byte to 1G";
	else if (o->total && o->total % o->msg)
		bad = "--total must be a multiple of --msg";
	else if (o->total && o->total / o->msg > 0x7fffffffull)
		bad = "--total / --msg: too many messages";
	else if (o->corrupt && !o->verify)
		bad = "--corrupt goes with --verify";
	else if (o->verify && !o->total)
		bad = "--verify goes with --total (the size sweep has -c)";
	else if (o->server && o->client)
		bad = "--server and --client: one or the other";
	else if (o->timeout <= 0)
		bad = "--timeout must be a positive number of seconds";
	else if (o->csv && o->total)
		bad = "--csv writes the size sweep: it does not go with --total";
	if (!bad && (o->server || o->client)) {
		char host[256];
		int port;

		if (bench_split_endpoint(o->server ? "--server" : "--client", o->server ? o->server :
				   o->client, host, sizeof(host), &port))
			return -1;
		if (o->client && !host[0])
			bad = "--client needs the server's host, as in --client 10.0.0.2:5000";
	}
	if (bad)
		fprintf(stderr, "rail-bench: %s (--help lists the options)\n", bad);
	return bad ? -1 : 0;
}

static int parse_opts(int argc, char **argv, struct bench_opts *o)
{
	static const struct option longopts[] = {
		{ "server", required_argument, NULL, 'S' },
		{ "client", required_argument, NULL, 'K' },
		{ "total", required_argument, NULL, 'T' },
		{ "msg", required_argument, NULL, 'M' },
		{ "verify", no_argument, NULL, 'V' },
		{ "timeout", required_argument, NULL, 'O' },
		{ "corrupt", required_argument, NULL, 'X' },
		{ "profiler", required_argument, NULL, 'P' },
		{ "cpus", required_argument, NULL, 'U' },
		{ "csv", required_argument, NULL, 'G' },
		{ "version", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "b:e:f:n:w:W:C:xd:D:cLBt:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'b': o->min_size = parse_size(optarg); break;
		case 'e': o->max_size = parse_size(optarg); break;
		case 'f': o->factor = atoi(optarg); break;
		case 'n': o->iters = atoi(optarg); break;
		case 'w': o->warmup = atoi(optarg); break;
		case 'W': o->window = atoi(optarg); break;
		case 'C': o->comms = atoi(optarg); break;
		case 'x': o->bidir = 1; break;
		case 'd': o->dev = atoi(optarg); break;
		case 'D': o->peer_dev = atoi(optarg); break;
		case 'c': o->check = 1; break;
		case 'L': o->lat_only = 1; break;
		case 'B': o->bw_only = 1; break;
		case 't': o->seconds = atof(optarg); break;
		case 'S': o->server = optarg; break;
		case 'K': o->client = optarg; break;
		case 'T': o->total = parse_size(optarg); if (!o->total) o->msg = 0; break;
		case 'M': o->msg = parse_size(optarg); break;
		case 'V': o->verify = 1; break;
		case 'O': o->timeout = atof(optarg); break;
		case 'X': o->corrupt = 1 + strtoull(optarg, NULL, 0); break;
		case 'P': bench_prof = parse_prof(optarg); break;
		case 'G': o->csv = optarg; break;
		case 'U':
			if (sscanf(optarg, "%d,%d", &o->cpu, &o->peer_cpu) != 2 || o->cpu < 0 ||
			    o->peer_cpu < 0) {
				fprintf(stderr, "rail-bench: --cpus takes two CPU numbers, A,B\n");
				return -1;
			}
			break;
		case 'v': printf("rail-bench (nccl-net-rail) %s\n", RAIL_VERSION_STRING); exit(0);
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "rail-bench: unexpected argument '%s' (--help lists the options)\n",
			argv[optind]);
		return -1;
	}
	return check_opts(o);
}

/* --cpus: run the calling process on one CPU only. */
static int pin_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) == 0)
		return 0;
	fprintf(stderr, "rail-bench: --cpus: cannot run on CPU %d: %s\n", cpu, strerror(errno));
	return -1;
}

/* --csv: close the file; rc, or 1 when its rows could not all be written. */
static int csv_close(const struct bench_opts *o, int rc)
{
	if (bench_csv && (ferror(bench_csv) | fclose(bench_csv))) {
		fprintf(stderr, "rail-bench: --csv %s: writing failed: %s\n", o->csv, strerror(errno));
		return rc ? rc : 1;
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct bench_opts o = { .min_size = 8, .max_size = 1ull << 30, .factor = 2, .iters = 1000,
				.warmup = 5, .window = 8, .comms = 1, .seconds = 0.5,
				.msg = 4u << 20, .timeout = 60, .cpu = -1, .peer_cpu = -1 };
	struct bench_side s = { 0 };
	int sv[2], status = 0, rc;
	pid_t pid;

	if (parse_opts(argc, argv, &o))
		return 2;
	if (o.csv && !(bench_csv = fopen(o.csv, "w"))) {
		fprintf(stderr, "rail-bench: --csv %s: cannot write it: %s\n", o.csv, strerror(errno));
		return 2;
	}
	if (o.server || o.client) {
		if (bench_oob_setup(&o, &s))
			return 1;
		return csv_close(&o, run_side(&s, &o));
	}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 1;
	if (o.cpu >= 0 && pin_cpu(o.peer_cpu))	/* the child inherits it */
		return 1;
	snprintf(s.peer_addr, sizeof(s.peer_addr), "pid %d", (int)getpid());
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		s.oob = sv[1];
		s.role = 1;
		s.dev = o.peer_dev;
		bench_csv = NULL;	/* the parent's: this side prints nothing */
		_exit(run_side(&s, &o));
	}
	close(sv[1]);
	if (o.cpu >= 0 && pin_cpu(o.cpu))
		return 1;
	snprintf(s.peer_addr, sizeof(s.peer_addr), "pid %d", (int)pid);
	s.oob = sv[0];
	s.dev = o.dev;
	rc = run_side(&s, &o);
	wait(&status);
	return csv_close(&o, rc ? rc : WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
