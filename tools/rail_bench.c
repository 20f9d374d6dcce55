/*
 * rail-bench: latency and bandwidth of the plugin between two processes.
 *
 *   rail-bench [options]                 two processes on this host (fork)
 *   rail-bench --server PORT [options]    one side of a two-host run
 *   rail-bench --client HOST:PORT [opts]  the other side
 *
 * Both processes use the plugin's version-neutral API (the same code NCCL
 * reaches through the ABI shims), with the transport chosen as the plugin
 * chooses it (NCCL_RAIL_TRANSPORT). Latency is half the round trip of a
 * ping-pong; bandwidth is one direction with a window of messages in
 * flight, like NCCL's pipelined steps.
 */
#include <getopt.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api.h"
#include "log.h"
#include "rail.h"
#include "sock.h"

struct bench_opts {
	size_t min_size, max_size;
	int factor;
	int iters, warmup, window;
	int dev, peer_dev;
	int check;
	int lat_only, bw_only;
	int comms;	/* parallel connections per direction */
	int bidir;	/* bandwidth in both directions at once */
	double seconds;
};

#define BENCH_MAX_COMMS 16
#define BENCH_MAX_WINDOW 64

struct bench_side {
	int role; /* 0 = A (starts the ping), 1 = B */
	int oob;  /* out-of-band socket to the peer */
	int ncomms;
	void *ctx;
	void *send[BENCH_MAX_COMMS], *recv[BENCH_MAX_COMMS];
	void *smh[BENCH_MAX_COMMS], *rmh[BENCH_MAX_COMMS];
	void *sbuf, *rbuf;
};

#define CHECK(call)                                                                  \
	do {                                                                         \
		ncclResult_t r_ = (call);                                            \
		if (r_ != ncclSuccess) {                                             \
			fprintf(stderr, "rail-bench: %s failed: result %d\n", #call, r_); \
			exit(1);                                                     \
		}                                                                    \
	} while (0)

static void oob_xchg(int fd, const void *out, void *in, size_t len)
{
	if (rail_sock_send_all(fd, out, len) || rail_sock_recv_all(fd, in, len)) {
		fprintf(stderr, "rail-bench: lost the out-of-band connection to the peer\n");
		exit(1);
	}
}

static void oob_barrier(int fd)
{
	char a = 'b', b;

	oob_xchg(fd, &a, &b, 1);
}

/* ncomms connections in each direction, all through one listen comm. */
static void connect_all(struct bench_side *s, int dev)
{
	char mine[NCCL_NET_HANDLE_MAXSIZE], theirs[NCCL_NET_HANDLE_MAXSIZE];
	void *lc = NULL;

	CHECK(rail_net_listen(s->ctx, dev, mine, &lc));
	oob_xchg(s->oob, mine, theirs, sizeof(mine));
	for (int c = 0; c < s->ncomms; c++) {
		char h[NCCL_NET_HANDLE_MAXSIZE];

		memcpy(h, theirs, sizeof(h));
		while (!s->send[c] || !s->recv[c]) {
			if (!s->send[c])
				CHECK(rail_net_connect(s->ctx, dev, -1, h, &s->send[c]));
			if (!s->recv[c])
				CHECK(rail_net_accept(lc, &s->recv[c]));
		}
	}
	CHECK(rail_net_close_listen(lc));
}

static void wait_req(void *req, int *size)
{
	int done = 0;

	while (!done)
		CHECK(rail_net_test(req, &done, size));
}

static void *post_send(struct bench_side *s, int c, size_t size)
{
	void *req = NULL;

	while (!req)
		CHECK(rail_net_isend(s->send[c], s->sbuf, size, s->role, s->smh[c], &req));
	return req;
}

static void *post_recv(struct bench_side *s, int c, char *buf, size_t size)
{
	void *req = NULL, *data = buf;
	int tag = !s->role;

	while (!req)
		CHECK(rail_net_irecv(s->recv[c], 1, &data, &size, &tag, &s->rmh[c], &req));
	return req;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Half round trip, in microseconds: the mean, and the median in *p50 (if not NULL). */
static double bench_latency(struct bench_side *s, size_t size, int iters, double *p50)
{
	uint64_t *rtt = p50 ? calloc((size_t)iters, sizeof(*rtt)) : NULL;
	uint64_t t0 = rail_now_ns(), t = t0;

	for (int i = 0; i < iters; i++) {
		void *rr = post_recv(s, 0, s->rbuf, size);
		uint64_t now;

		if (s->role == 0) {
			wait_req(post_send(s, 0, size), NULL);
			wait_req(rr, NULL);
		} else {
			wait_req(rr, NULL);
			wait_req(post_send(s, 0, size), NULL);
		}
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

/* One attempt, as NCCL's proxy makes per pass: NULL when the plugin says "later". */
static void *try_post(struct bench_side *s, int is_send, int c, char *buf, size_t size)
{
	void *req = NULL, *data = buf;
	int tag = !s->role;

	if (is_send)
		CHECK(rail_net_isend(s->send[c], s->sbuf, size, s->role, s->smh[c], &req));
	else
		CHECK(rail_net_irecv(s->recv[c], 1, &data, &size, &tag, &s->rmh[c], &req));
	return req;
}

/*
 * A sends and B receives (both ways with bidir) on every comm, each with
 * `window` messages in flight; returns GB/s of one direction, all comms.
 * Like NCCL's proxy: each stream (a comm, one direction) posts in order
 * what its window allows (a refused post is retried on a later pass, not
 * spun on) and tests only its oldest request.
 */
struct bw_lane {
	int is_send, comm;
	int posted, done;
	void *req[BENCH_MAX_WINDOW];	/* [done, posted) in flight, by index % window */
};

static int lane_pass(struct bench_side *s, struct bw_lane *l, size_t size, int iters, int window)
{
	int d = 0;

	while (l->posted < iters && l->posted - l->done < window) {
		char *buf = (char *)s->rbuf + ((size_t)l->comm * window + l->posted % window) * size;
		void *r = try_post(s, l->is_send, l->comm, buf, size);

		if (!r)
			break;
		l->req[l->posted++ % window] = r;
	}
	if (l->done == l->posted)
		return 0;
	CHECK(rail_net_test(l->req[l->done % window], &d, NULL));
	l->done += d;
	return d;
}

static double bench_bandwidth(struct bench_side *s, size_t size, int iters, int window, int bidir)
{
	struct bw_lane lanes[2 * BENCH_MAX_COMMS];
	int nl = 0, left = 0, idle = 0;
	uint64_t t0;

	for (int c = 0; c < s->ncomms; c++) {
		for (int dir = 0; dir < 2; dir++) {
			int is_send = dir == 0;

			if (!bidir && is_send != (s->role == 0))
				continue;
			memset(&lanes[nl], 0, sizeof(lanes[nl]));
			lanes[nl].is_send = is_send;
			lanes[nl++].comm = c;
			left += iters;
		}
	}
	oob_barrier(s->oob);
	t0 = rail_now_ns();
	while (left > 0) {
		int progressed = 0;

		for (int i = 0; i < nl; i++) {
			int d = lane_pass(s, &lanes[i], size, iters, window);

			left -= d;
			progressed |= d;
		}
		/*
		 * Give the CPU away when nothing moved (as NCCL's proxy thread
		 * does), and nap when nothing moved for a while: with large
		 * messages the helpers and the kernel need the cores, not us.
		 */
		idle = progressed ? 0 : idle + 1;
		if (idle > 64)
			usleep(idle > 1024 ? 100 : 20);
		else if (idle)
			sched_yield();
	}
	oob_barrier(s->oob);
	return (double)size * iters * s->ncomms / (double)(rail_now_ns() - t0);
}

static void fill_check(struct bench_side *s, size_t size, int verify)
{
	unsigned char *b = verify ? s->rbuf : s->sbuf;

	for (size_t i = 0; i < size; i++) {
		unsigned char v = (unsigned char)(i * 131 + size);

		if (!verify)
			b[i] = v;
		else if (b[i] != v) {
			fprintf(stderr, "rail-bench: data mismatch at byte %zu of %zu\n", i, size);
			exit(1);
		}
	}
}

static int iters_for(const struct bench_opts *o, size_t size)
{
	/* Aim for about o->seconds per size at ~1 GB/s, within [3, iters]. */
	double budget = o->seconds * 1e9 / (double)(size + 4096);
	int n = budget < o->iters ? (int)budget : o->iters;

	return n < 3 ? 3 : n;
}

static void setup_side(struct bench_side *s, const struct bench_opts *o)
{
	size_t rlen = o->max_size * (size_t)o->window * (size_t)o->comms;

	s->ncomms = o->comms;
	CHECK(rail_net_init(&s->ctx, 0x7261696c, -1, NULL, 12));
	connect_all(s, s->role == 0 ? o->dev : o->peer_dev);
	if (posix_memalign(&s->sbuf, 4096, o->max_size) || posix_memalign(&s->rbuf, 4096, rlen)) {
		fprintf(stderr, "rail-bench: cannot allocate %zu bytes\n", rlen);
		exit(1);
	}
	memset(s->sbuf, 0, o->max_size);
	memset(s->rbuf, 0, rlen);
	for (int c = 0; c < s->ncomms; c++) {
		CHECK(rail_net_reg_mr(s->send[c], s->sbuf, o->max_size, NCCL_PTR_HOST, &s->smh[c]));
		CHECK(rail_net_reg_mr(s->recv[c], s->rbuf, rlen, NCCL_PTR_HOST, &s->rmh[c]));
	}
}

static void teardown_side(struct bench_side *s)
{
	for (int c = 0; c < s->ncomms; c++) {
		CHECK(rail_net_dereg_mr(s->send[c], s->smh[c]));
		CHECK(rail_net_dereg_mr(s->recv[c], s->rmh[c]));
		CHECK(rail_net_close_send(s->send[c]));
		CHECK(rail_net_close_recv(s->recv[c]));
	}
	CHECK(rail_net_finalize(s->ctx));
	free(s->sbuf);
	free(s->rbuf);
}

static void run_side(struct bench_side *s, const struct bench_opts *o)
{
	setup_side(s, o);
	if (s->role == 0)
		printf("# rail-bench: %d connection(s) per direction, window %d, %s, sizes %zu..%zu\n"
		       "#%12s %10s %12s %12s %12s\n", o->comms, o->window,
		       o->bidir ? "bandwidth both ways at once (GB/s per direction)"
				: "bandwidth one way", o->min_size, o->max_size,
		       "size(B)", "iters", "lat(us)", "bw(GB/s)", "lat_p50(us)");
	for (size_t size = o->min_size; size <= o->max_size; size *= (size_t)o->factor) {
		int iters = iters_for(o, size);
		double lat = 0, bw = 0, p50 = 0;

		if (o->check) {
			fill_check(s, size, 0);
			bench_latency(s, size, 1, NULL);
			fill_check(s, size, 1);
		}
		if (!o->bw_only) {
			bench_latency(s, size, o->warmup, NULL);
			lat = bench_latency(s, size, RAIL_MAX(iters / 4, 3), &p50);
		}
		if (!o->lat_only) {
			bench_bandwidth(s, size, RAIL_MIN(o->warmup, iters), o->window, o->bidir);
			bw = bench_bandwidth(s, size, iters, o->window, o->bidir);
		}
		if (s->role == 0) {
			printf(" %12zu %10d %12.2f %12.3f %12.2f\n", size, iters, lat, bw, p50);
			fflush(stdout);
		}
		if (size > o->max_size / (size_t)o->factor)
			break;
	}
	teardown_side(s);
}

static size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	switch (*end) {
	case 'k': case 'K': v *= 1024; break;
	case 'm': case 'M': v *= 1024 * 1024; break;
	case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
	}
	return (size_t)v;
}

static void usage(void)
{
	printf("usage: rail-bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
	       "                  [-W WINDOW] [-C CONNS] [-x] [-d DEV] [-D PEER_DEV] [-c] [-L|-B]\n"
	       "                  [-t SEC]\n"
	       "                  [--server PORT | --client HOST:PORT]\n"
	       "  -b/-e  smallest/largest message (default 8 and 1G; k/M/G suffixes)\n"
	       "  -f     size multiplier per step (default 2)\n"
	       "  -n     most iterations per size (default 1000; fewer for large sizes)\n"
	       "  -W     messages in flight per connection for bandwidth (default 8, at most 64)\n"
	       "  -C     connections per direction, all busy at once (default 1, at most 16)\n"
	       "  -x     bandwidth in both directions at once (as in an all-reduce)\n"
	       "  -d/-D  device of this process / of the forked peer (default 0/0)\n"
	       "  -c     check every byte of one transfer per size\n"
	       "  -L/-B  latency only / bandwidth only\n"
	       "  -t     time budget per size in seconds at 1 GB/s (default 0.5)\n"
	       "The transport is the plugin's choice: set NCCL_RAIL_TRANSPORT=tcp|ib to force.\n");
}

static int oob_setup(const char *server, const char *client, int *fd, int *role)
{
	union rail_sockaddr a;
	int lfd, err;

	if (server) {
		memset(&a, 0, sizeof(a));
		a.sin.sin_family = AF_INET;
		rail_sockaddr_set_port(&a, atoi(server));
		err = rail_sock_listen(&a, 1, &lfd, &a);
		while (!err && (err = rail_sock_accept(lfd, fd, &a)) == -EAGAIN)
			usleep(1000);
		*role = 0;
	} else {
		err = rail_sockaddr_parse(client, &a);
		if (!err)
			err = rail_sock_connect_start(&a, fd);
		while (!err && (err = rail_sock_connect_done(*fd)) == -EAGAIN)
			usleep(1000);
		*role = 1;
	}
	if (!err)
		err = rail_sock_set_nonblocking(*fd, 0);
	return err;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "server", required_argument, NULL, 'S' },
		{ "client", required_argument, NULL, 'K' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct bench_opts o = { .min_size = 8, .max_size = 1ull << 30, .factor = 2, .iters = 1000,
				.warmup = 5, .window = 8, .comms = 1, .seconds = 0.5 };
	const char *server = NULL, *client = NULL;
	struct bench_side s = { 0 };
	int c, sv[2], status = 0;

	while ((c = getopt_long(argc, argv, "b:e:f:n:w:W:C:xd:D:cLBt:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'b': o.min_size = parse_size(optarg); break;
		case 'e': o.max_size = parse_size(optarg); break;
		case 'f': o.factor = atoi(optarg); break;
		case 'n': o.iters = atoi(optarg); break;
		case 'w': o.warmup = atoi(optarg); break;
		case 'W': o.window = atoi(optarg); break;
		case 'C': o.comms = atoi(optarg); break;
		case 'x': o.bidir = 1; break;
		case 'd': o.dev = atoi(optarg); break;
		case 'D': o.peer_dev = atoi(optarg); break;
		case 'c': o.check = 1; break;
		case 'L': o.lat_only = 1; break;
		case 'B': o.bw_only = 1; break;
		case 't': o.seconds = atof(optarg); break;
		case 'S': server = optarg; break;
		case 'K': client = optarg; break;
		default: usage(); return c == 'h' ? 0 : 2;
		}
	}
	if (o.factor < 2 || o.window < 1 || o.window > BENCH_MAX_WINDOW || o.comms < 1 ||
	    o.comms > BENCH_MAX_COMMS || o.min_size < 1 ||
	    o.max_size < o.min_size || o.iters < 1) {
		usage();
		return 2;
	}
	if (server || client) {
		if (oob_setup(server, client, &s.oob, &s.role)) {
			fprintf(stderr, "rail-bench: out-of-band connection failed\n");
			return 1;
		}
		run_side(&s, &o);
		return 0;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 1;
	fflush(stdout);
	if (fork() == 0) {
		close(sv[0]);
		s.oob = sv[1];
		s.role = 1;
		run_side(&s, &o);
		_exit(0);
	}
	close(sv[1]);
	s.oob = sv[0];
	run_side(&s, &o);
	wait(&status);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
