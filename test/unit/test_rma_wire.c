/*
 * nccl-net-rail unit tests: what the TCP RMA backend accepts from the
 * network (src/rma/rma_wire.c, src/rma/rma_apply.c).
 *
 * The decoders refuse anything malformed, naming why. Then a hostile peer:
 * rank 0 is this plugin (the core API, in a thread), rank 1 is this test
 * speaking the wire format by hand. It joins the group properly, makes one
 * good put and signal, then sends on each context's stream one frame that
 * must be refused before any byte is written: a put past the end of a
 * window, a put whose offset wraps, a put into a window that does not
 * exist, a misaligned signal, a frame that is not one, and a get past the
 * end (answered with an error, since a get writes nothing); and, alone, a
 * reply on rank 0's own stream when rank 0 sent no get, or to a get whose
 * request has not left yet. Rank 0 must
 * leave every byte of its windows alone, WARN naming the peer, the call and
 * the window, close each broken stream, and report the error through
 * queryLastError.
 */
#include "unit.h"

#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api_rma.h"
#include "handle.h"
#include "rail.h"
#include "rma/rma_tcp.h"
#include "sock.h"
#include "wire.h"

/* ---- decoders ------------------------------------------------------------------ */

static void test_frame_decode(void **state)
{
	struct rma_frame f = { .op = RMA_OP_PUT, .win = 3, .off = 8, .len = 16 }, g;
	uint8_t b[RMA_FRAME_SIZE];
	char why[160];

	(void)state;
	rma_frame_encode(&f, b);
	assert_int_equal(rma_frame_decode(b, &g, why, sizeof(why)), 0);
	assert_int_equal(g.op, RMA_OP_PUT);
	assert_int_equal(g.win, 3);
	assert_int_equal(g.len, 16);
	b[0] ^= 1;
	assert_int_equal(rma_frame_decode(b, &g, why, sizeof(why)), -EPROTO);
	assert_non_null(strstr(why, "out of step"));
	rma_frame_encode(&f, b);
	b[4] = 9;
	assert_int_equal(rma_frame_decode(b, &g, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "unknown RMA operation 9"));
	f.len = RMA_MAX_LEN + 1;
	rma_frame_encode(&f, b);
	assert_int_equal(rma_frame_decode(b, &g, why, sizeof(why)), -EBADMSG);
	f = (struct rma_frame){ .op = RMA_OP_PUT, .status = 5 };
	rma_frame_encode(&f, b);
	assert_int_equal(rma_frame_decode(b, &g, why, sizeof(why)), -EBADMSG);
	/* A signal's length is its value: any value goes. */
	f = (struct rma_frame){ .op = RMA_OP_SIGNAL, .len = UINT64_MAX };
	rma_frame_encode(&f, b);
	assert_int_equal(rma_frame_decode(b, &g, why, sizeof(why)), 0);
}

static void test_hello_and_record_decode(void **state)
{
	struct rma_hello h = { .kind = RMA_LINK_DATA, .nonce = 7, .rank = 1, .nranks = 2, .seq = 1 };
	struct rma_hello g;
	struct rma_record r = { .index = 4, .nranks = 2, .base = 1, .size = 2 }, q;
	uint8_t b[RMA_HELLO_SIZE], c[RMA_RECORD_SIZE];
	char why[160];

	(void)state;
	rma_hello_encode(&h, b);
	assert_int_equal(rma_hello_decode(b, &g, why, sizeof(why)), 0);
	assert_int_equal(g.seq, 1);
	b[20] = 0;	/* nranks 0: checksum first */
	assert_int_equal(rma_hello_decode(b, &g, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "checksum"));
	h.rank = 2;
	rma_hello_encode(&h, b);
	assert_int_equal(rma_hello_decode(b, &g, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "rank 2 of 2"));
	rma_hello_encode(&h, b);
	rail_put_u16(b + 4, 9);
	assert_int_equal(rma_hello_decode(b, &g, why, sizeof(why)), -EPROTONOSUPPORT);
	rma_record_encode(&r, c);
	assert_int_equal(rma_record_decode(c, &q), 0);
	assert_int_equal(q.index, 4);
	c[16] ^= 1;
	assert_int_equal(rma_record_decode(c, &q), -EPROTO);
	r.status = -1;
	rma_record_encode(&r, c);
	assert_int_equal(rma_record_decode(c, &q), -EPROTO);
}

/* ---- a hostile peer ------------------------------------------------------------- */

#define NCTX 6
#define WIN 4096

static char handles[2][RAIL_HANDLE_SIZE];
static pthread_barrier_t bar;
static struct {
	char win[WIN];
	uint64_t sig[3];
	int has_error;
	char fail[256];
	uint64_t get_id;	/* rank0_queued_get's get, as its reply names it */
} r0;

/* Rank 0's plugin objects: its group, one context call, a data window and the signals. */
struct r0_objs {
	void *ctx, *coll, *x, *wmh, *smh;
};

/* Rank 0 joins the group with win (size bytes) as window 0: 0, or r0.fail says why. */
static int r0_join(struct r0_objs *o, void *win, size_t size)
{
	void *lc = NULL, *hp[2] = { handles[0], handles[1] };

	memset(o, 0, sizeof(*o));
	if (rail_rma_init(&o->ctx, 1, unit_log_sink, 14) ||
	    rail_rma_listen(o->ctx, 0, handles[0], &lc)) {
		snprintf(r0.fail, sizeof(r0.fail), "init or listen failed");
		pthread_barrier_wait(&bar);
		return -1;
	}
	pthread_barrier_wait(&bar);
	if (rail_rma_connect(NULL, hp, 2, 0, lc, &o->coll) || rail_rma_close_listen(lc) ||
	    rail_rma_create_context(o->coll, NCTX, -1, 1, &o->x) ||
	    rail_rma_reg_mr_sym(o->coll, win, size, NCCL_PTR_HOST, 0, -1, 0, &o->wmh) ||
	    rail_rma_reg_mr_sym(o->coll, r0.sig, sizeof(r0.sig), NCCL_PTR_HOST, 0, -1, 3, &o->smh)) {
		snprintf(r0.fail, sizeof(r0.fail), "joining the group failed");
		return -1;
	}
	return 0;
}

static void r0_leave(struct r0_objs *o)
{
	rail_rma_dereg_mr_sym(o->coll, o->wmh);
	rail_rma_dereg_mr_sym(o->coll, o->smh);
	rail_rma_destroy_context(o->x);
	rail_rma_close_coll(o->coll);
	rail_rma_finalize(o->ctx);
}

/* Once the test's frames are all sent: wait up to 10 s for the error, then leave. */
static void r0_finish(struct r0_objs *o)
{
	uint64_t until;

	pthread_barrier_wait(&bar);	/* the test's frames are all sent */
	until = rail_now_ns() + 10000000000ull;
	while (rail_now_ns() < until && !r0.has_error)
		rail_rma_query_last_error(o->x, &r0.has_error);
	pthread_barrier_wait(&bar);	/* the test looked at the sockets */
	r0_leave(o);
}

/* Rank 0: this plugin, through the core's RMA API (rank 1 is the test). */
static void *rank0(void *arg)
{
	struct r0_objs o;

	(void)arg;
	memset(r0.win, 0xaa, WIN);
	if (r0_join(&o, r0.win, WIN))
		return NULL;
	r0_finish(&o);
	return NULL;
}

/* Rank 1's sockets: its control link, one stream per context and its lanes, each way. */
#define LANES 2
static struct {
	union rail_sockaddr peer;
	uint64_t peer_nonce, nonce;
	int lfd;
	int ctrl_out, ctrl_in;
	int out[NCTX], in[NCTX];
	int lout[LANES], lin[LANES];
} f;

static int fake_connect(uint16_t kind, uint32_t seq, uint32_t index)
{
	struct rma_hello h = { .kind = kind, .nonce = f.peer_nonce, .rank = 1, .nranks = 2,
			       .seq = seq, .index = index };
	uint8_t b[RMA_HELLO_SIZE];
	int fd = -1;

	assert_int_equal(rail_sock_connect_by(&f.peer, rail_now_ns() + 5000000000ull, 1, &fd), 0);
	rail_sock_set_nonblocking(fd, 0);
	rma_hello_encode(&h, b);
	assert_int_equal(rail_sock_send_all(fd, b, sizeof(b)), 0);
	return fd;
}

static int fake_accept(uint16_t kind, uint32_t seq, uint32_t *index)
{
	union rail_sockaddr a;
	struct rma_hello h;
	uint8_t b[RMA_HELLO_SIZE];
	char why[160];
	int fd = -1;

	assert_int_equal(rail_sock_accept_wait(f.lfd, 5000, &fd, &a), 0);
	rail_sock_set_nonblocking(fd, 0);
	assert_int_equal(rail_sock_recv_all(fd, b, sizeof(b)), 0);
	assert_int_equal(rma_hello_decode(b, &h, why, sizeof(why)), 0);
	assert_int_equal(h.kind, kind);
	assert_int_equal(h.seq, seq);
	assert_int_equal(h.nonce, f.nonce);
	*index = h.index;
	return fd;
}

/* One record each way on the control links (rank 0's first, as the exchange reads). */
static void fake_exchange(const struct rma_record *mine, struct rma_record *theirs)
{
	uint8_t b[RMA_RECORD_SIZE];

	rma_record_encode(mine, b);
	assert_int_equal(rail_sock_send_all(f.ctrl_out, b, sizeof(b)), 0);
	assert_int_equal(rail_sock_recv_all(f.ctrl_in, b, sizeof(b)), 0);
	assert_int_equal(rma_record_decode(b, theirs), 0);
}

/* Join as rank 1, asking for lanes (0: what a build without lanes sends). */
static void fake_join(uint32_t lanes)
{
	struct rail_handle h = { .transport = RAIL_TRANSPORT_RMA_TCP };
	struct rma_record me = { .index = 1, .nranks = 2, .size = lanes }, them;
	char why[160];
	uint32_t idx;

	rail_sockaddr_parse("127.0.0.1", &h.addr);
	assert_int_equal(rail_sock_listen(&h.addr, 16, &f.lfd, &h.addr), 0);
	f.nonce = h.nonce = 0x5eed;
	assert_int_equal(rail_handle_encode(&h, handles[1], RAIL_HANDLE_SIZE), 0);
	pthread_barrier_wait(&bar);	/* both handles are there */
	assert_int_equal(rail_handle_decode(handles[0], RAIL_HANDLE_SIZE, &h, why, sizeof(why)), 0);
	f.peer = h.addr;
	f.peer_nonce = h.nonce;
	f.ctrl_out = fake_connect(RMA_LINK_CTRL, 0, 0);
	f.ctrl_in = fake_accept(RMA_LINK_CTRL, 0, &idx);
	fake_exchange(&me, &them);
	assert_int_equal(them.index, 0);
	for (uint32_t c = 0; c < NCTX; c++)
		f.out[c] = fake_connect(RMA_LINK_DATA, 1, c);
	for (uint32_t l = 0; l < lanes; l++)
		f.lout[l] = fake_connect(RMA_LINK_DATA, 1, NCTX + l);
	for (uint32_t c = 0; c < NCTX + lanes; c++) {
		int fd = fake_accept(RMA_LINK_DATA, 1, &idx);

		assert_true(idx < NCTX + lanes);
		if (idx < NCTX)
			f.in[idx] = fd;
		else
			f.lin[idx - NCTX] = fd;
	}
	/* Two windows: the data window (index 0) and the signals (index 1). */
	for (uint32_t w = 0; w < 2; w++) {
		me = (struct rma_record){ .index = w, .nranks = 2, .size = 1ull << 40 };
		fake_exchange(&me, &them);
		assert_int_equal(them.index, w);
	}
}

static void fake_frame(int fd, uint8_t op, uint32_t win, uint64_t off, uint64_t len,
		       const void *body, size_t body_len)
{
	struct rma_frame fr = { .op = op, .win = win, .off = off, .len = len };
	uint8_t b[RMA_FRAME_SIZE];

	rma_frame_encode(&fr, b);
	send(fd, b, sizeof(b), MSG_NOSIGNAL);
	if (body_len)
		send(fd, body, body_len, MSG_NOSIGNAL);
}

/* A block of a striped put on a lane: a PUT whose id names its context and STRIPED frame. */
static void fake_block(int fd, uint32_t context, uint32_t seq, uint32_t win, uint64_t off,
		       const void *body, size_t len)
{
	struct rma_frame fr = { .op = RMA_OP_PUT, .win = win, .off = off, .len = len,
				.id = (uint64_t)context << 32 | seq };
	uint8_t b[RMA_FRAME_SIZE];

	rma_frame_encode(&fr, b);
	send(fd, b, sizeof(b), MSG_NOSIGNAL);
	send(fd, body, len, MSG_NOSIGNAL);
}

/* The test looked at the sockets: rank 0 tears down; it must have seen the error. */
static void rank0_done(pthread_t th)
{
	pthread_barrier_wait(&bar);
	pthread_join(th, NULL);
	pthread_barrier_destroy(&bar);
	if (r0.fail[0])
		fail_msg("%s", r0.fail);
	assert_true(r0.has_error);
}

/* Rank 0's window holds the test's bytes in [lo, hi) and its own everywhere else. */
static void check_window(int lo, int hi)
{
	for (int i = 0; i < WIN; i++) {
		if ((uint8_t)r0.win[i] != (i >= lo && i < hi ? 0xee : 0xaa))
			fail_msg("byte %d of rank 0's window is 0x%02x", i, (uint8_t)r0.win[i]);
	}
}

/* Close rank 1's sockets (lanes: how many it joined with). */
static void fake_leave(int lanes)
{
	for (int c = 0; c < NCTX; c++) {
		close(f.out[c]);
		close(f.in[c]);
	}
	for (int l = 0; l < lanes; l++) {
		close(f.lout[l]);
		close(f.lin[l]);
	}
	close(f.ctrl_out);
	close(f.ctrl_in);
	close(f.lfd);
	unit_log_release();
}

/* The stream was closed by rank 0: reading it ends (EOF or reset) within 5 s. */
static int stream_closed(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	return poll(&p, 1, 5000) == 1 && recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

/* Rank 0 (fn) in its thread over TCP, and this test joined as rank 1 without lanes. */
static void hostile_start(pthread_t *th, void *(*fn)(void *))
{
	unit_log_capture();
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", "10", 1);
	pthread_barrier_init(&bar, NULL, 2);
	assert_int_equal(pthread_create(th, NULL, fn, NULL), 0);
	fake_join(0);
}

static void test_hostile_peer(void **state)
{
	static char evil[200];
	pthread_t th;
	uint8_t b[RMA_FRAME_SIZE];
	struct rma_frame reply;
	char why[160];

	(void)state;
	memset(evil, 0xee, sizeof(evil));
	hostile_start(&th, rank0);
	/* A good put and signal first: the stream works. */
	fake_frame(f.out[0], RMA_OP_PUT, 0, 0, 16, evil, 16);
	fake_frame(f.out[0], RMA_OP_SIGNAL, 1, 8, 1, NULL, 0);
	fake_frame(f.out[0], RMA_OP_PUT, 0, WIN - 6, 100, evil, 100);		/* past the end */
	fake_frame(f.out[1], RMA_OP_PUT, 0, UINT64_MAX - 10, 100, evil, 100);	/* wraps */
	fake_frame(f.out[2], RMA_OP_PUT, 7, 0, 8, evil, 8);			/* no window 7 */
	fake_frame(f.out[3], RMA_OP_SIGNAL, 1, 4, 1, NULL, 0);			/* misaligned */
	send(f.out[4], "NOT A FRAME, JUST BYTES: 40 OF THEM ....", RMA_FRAME_SIZE, MSG_NOSIGNAL);
	fake_frame(f.out[5], RMA_OP_GET, 0, WIN, 1, NULL, 0);			/* past the end */
	pthread_barrier_wait(&bar);
	for (int c = 0; c < 5; c++)
		assert_true(stream_closed(f.out[c]));
	/* The get is answered with an error, and the stream stays. */
	assert_int_equal(rail_sock_recv_all(f.out[5], b, sizeof(b)), 0);
	assert_int_equal(rma_frame_decode(b, &reply, why, sizeof(why)), 0);
	assert_int_equal(reply.op, RMA_OP_REPLY);
	assert_int_equal(reply.status, EFAULT);
	assert_int_equal(reply.len, 0);
	rank0_done(th);
	check_window(0, 16);
	assert_int_equal(r0.sig[1], 1);
	assert_int_equal(r0.sig[0], 0);
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput from rank 1 (127.0.0.1:", "refused on rank 0 "
			    "of 2, device 0: a put of 100 bytes at offset 4090 is outside window 0 "
			    "(4096 bytes); the stream is closed");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput from rank 1", "at offset 18446744073709551605 "
			    "is outside window 0");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput from rank 1", "a put of 8 bytes at offset 0 "
			    "names window 7, not registered here");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iputSignal from rank 1", "a signal of 8 bytes at "
			    "offset 4 is not 8-byte aligned in window 1");
	unit_assert_logged2(RAIL_LOG_WARN, "sent a bad frame on context 4", "out of step");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iget from rank 1", "a get of 1 bytes at offset "
			    "4096 is outside window 0");
	fake_leave(0);
}

/*
 * Rank 0 fills its context-1 stream to rank 1 (which never reads it) with
 * puts until one stays unwritten, then posts a get of 8 bytes into offset 64
 * of its window behind it: the get's request has not left. Its wire id (as
 * api_rma.c encodes a request: index above 24 bits of stamp) goes to
 * r0.get_id for the test.
 */
static void *rank0_queued_get(void *arg)
{
	struct r0_objs o;
	void *req = NULL;
	uint64_t v;
	int done = 1;

	(void)arg;
	memset(r0.win, 0xaa, WIN);
	if (r0_join(&o, r0.win, WIN))
		return NULL;
	for (int i = 0; i < 100000 && done; i++) {
		if (rail_rma_iput(o.x, 1, 0, o.wmh, WIN, 0, o.wmh, 1, &req) ||
		    rail_rma_test(o.coll, req, &done))
			break;
	}
	if (done || rail_rma_iget(o.x, 1, 0, o.wmh, 8, 64, o.wmh, 1, &req))
		snprintf(r0.fail, sizeof(r0.fail), "no put stayed unwritten, or the get failed");
	v = (uint64_t)(uintptr_t)req;
	r0.get_id = (v & 0xffffff) << 32 | ((v >> 24) & 0xffff);
	pthread_barrier_wait(&bar);	/* the get is posted */
	r0_finish(&o);
	return NULL;
}

/* Read fd to its end: 1 once rank 0 closed it (EOF or reset) within 10 s of quiet. */
static int stream_drained(int fd)
{
	static char buf[1 << 16];

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 10000) != 1)
			return 0;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return 1;
	}
}

/*
 * Replies rank 0 must refuse, each on its own stream of context 1, naming
 * the reply and writing nothing: one when rank 0 asked nothing (rank0), and
 * one to a get whose request has not left (rank0_queued_get; rank 1 made it
 * up, knowing the id), since a reply is matched only to a get whose request
 * was written.
 */
static void reply_refused(void *(*fn)(void *), int queued)
{
	static char evil[8];
	struct rma_frame reply = { .op = RMA_OP_REPLY, .id = 1ull << 32, .len = sizeof(evil) };
	uint8_t b[RMA_FRAME_SIZE];
	char want[96];
	pthread_t th;

	memset(evil, 0xee, sizeof(evil));
	hostile_start(&th, fn);
	if (queued) {
		pthread_barrier_wait(&bar);	/* the get is posted */
		reply.id = r0.get_id;
	}
	rma_frame_encode(&reply, b);
	send(f.in[1], b, sizeof(b), MSG_NOSIGNAL);
	send(f.in[1], evil, sizeof(evil), MSG_NOSIGNAL);
	pthread_barrier_wait(&bar);
	assert_true(stream_drained(f.in[1]));
	rank0_done(th);
	check_window(0, 0);
	snprintf(want, sizeof(want), "waiting on context 1 (id 0x%llx, 8 bytes); the stream is "
		 "closed", (unsigned long long)reply.id);
	if (!unit_log_count2(RAIL_LOG_WARN, "sent a reply for no get of this rank", want)) {
		unit_log_dump();
		fail_msg("no WARN of a reply for no get containing '%s'", want);
	}
	fake_leave(0);
}

static void test_reply_for_no_get(void **state)
{
	(void)state;
	reply_refused(rank0, 0);
}

static void test_reply_before_request(void **state)
{
	(void)state;
	reply_refused(rank0_queued_get, 1);
}

/*
 * The same with lanes (rank 1 asks for 2): a striped put whose block comes
 * on lane 0 lands and its signal follows it; then a signal that waits for a
 * block on lane 0 when lane 0 carries a block of no context of the call:
 * the lane is closed, the waiting stream fails naming why, and neither the
 * block nor the signal touches memory.
 */
static void test_hostile_lanes(void **state)
{
	static char evil[64];
	pthread_t th;
	uint64_t until;

	(void)state;
	memset(&r0, 0, sizeof(r0));
	memset(evil, 0xee, sizeof(evil));
	unit_log_capture();
	pthread_barrier_init(&bar, NULL, 2);
	assert_int_equal(pthread_create(&th, NULL, rank0, NULL), 0);
	fake_join(LANES);
	/* context 1: STRIPED (its frame 0) and a signal into word 2; the block on lane 0 */
	fake_frame(f.out[1], RMA_OP_STRIPED, 0, 32, 16, NULL, 0);
	fake_frame(f.out[1], RMA_OP_SIGNAL, 1, 16, 1, NULL, 0);
	fake_block(f.lout[0], 1, 0, 0, 32, evil, 16);
	until = rail_now_ns() + 5000000000ull;
	while (__atomic_load_n(&r0.sig[2], __ATOMIC_ACQUIRE) != 1 && rail_now_ns() < until)
		usleep(1000);
	/* context 0: STRIPED and a signal into word 0, then lane 0 carries a block of context 9 */
	fake_frame(f.out[0], RMA_OP_STRIPED, 0, 64, 16, NULL, 0);
	fake_frame(f.out[0], RMA_OP_SIGNAL, 1, 0, 1, NULL, 0);
	fake_block(f.lout[0], 9, 0, 0, 64, evil, 16);
	pthread_barrier_wait(&bar);
	assert_true(stream_closed(f.lout[0]));
	assert_true(stream_closed(f.out[0]));
	rank0_done(th);
	assert_int_equal(r0.sig[2], 1);
	assert_int_equal(r0.sig[0], 0);
	check_window(32, 48);
	unit_assert_logged2(RAIL_LOG_WARN, "rank 1 (127.0.0.1:", "sent a put for context 9 on "
			    "lane 0, which carries puts of this call's contexts only");
	unit_assert_logged2(RAIL_LOG_WARN, "context 0's stream from rank 1", "waits for the bytes "
			    "of a striped put on a lane that failed");
	fake_leave(LANES);
}

/* ---- the stall check (NCCL_RAIL_RMA_STALL_WARN=1) ----------------------------------- */

#define BIG (32u << 20)	/* more than loopback's socket buffers hold */
static struct {
	char *src;		/* rank 0's big window */
	atomic_int stop;	/* the test is done: rank 0 tears down */
	atomic_int put_done;	/* 1 done, -1 failed */
	atomic_int second;	/* set: rank 0 posts an 8-byte put on context 0 (it may fail) */
	int mode;		/* STALL_OUT: rank 0 puts BIG bytes to rank 1; STALL_GATE: it only progresses */
} st;
enum { STALL_OUT = 1, STALL_GATE = 2, STALL_GET = 3 };

/* Rank 0 with a window of BIG bytes, calling test or rmaProgress until st.stop. */
static void *rank0_stall(void *arg)
{
	struct r0_objs o;
	void *req = NULL;
	int done = 0;

	(void)arg;
	if (r0_join(&o, st.src, BIG))
		return NULL;
	if (st.mode == STALL_OUT &&
	    rail_rma_iput(o.x, 0, 0, o.wmh, BIG, 0, o.wmh, 1, &req) != ncclSuccess)
		snprintf(r0.fail, sizeof(r0.fail), "iput failed");
	if (st.mode == STALL_GET &&
	    rail_rma_iget(o.x, 0, 0, o.wmh, 8, 0, o.wmh, 1, &req) != ncclSuccess)
		snprintf(r0.fail, sizeof(r0.fail), "iget failed");
	while (!atomic_load(&st.stop) && !r0.fail[0]) {
		void *req2;

		if (atomic_exchange(&st.second, 0))
			rail_rma_iput(o.x, 0, 0, o.wmh, 8, 0, o.wmh, 1, &req2);	/* to fail */
		if (st.mode != STALL_GATE && !done) {
			if (rail_rma_test(o.coll, req, &done) != ncclSuccess)
				done = -1;	/* the put failed: the test says whether it should */
			atomic_store(&st.put_done, done);
		} else {
			rail_rma_progress(o.x);
		}
		usleep(1000);
	}
	r0_leave(&o);
	return NULL;
}

/* Wait up to ms for a captured line at level with both substrings. */
static int logged_within(int level, const char *a, const char *b, int ms)
{
	for (int i = 0; i < ms / 10 && !unit_log_count2(level, a, b); i++)
		usleep(10000);
	return unit_log_count2(level, a, b) > 0;
}

static void stall_start(int mode, int lanes, pthread_t *th)
{
	memset(&r0, 0, sizeof(r0));
	st.src = calloc(1, BIG);
	assert_non_null(st.src);
	atomic_store(&st.stop, 0);
	atomic_store(&st.put_done, 0);
	atomic_store(&st.second, 0);
	st.mode = mode;
	unit_log_capture();
	setenv("NCCL_RAIL_RMA_STALL_WARN", "1", 1);
	pthread_barrier_init(&bar, NULL, 2);
	assert_int_equal(pthread_create(th, NULL, rank0_stall, NULL), 0);
	fake_join(lanes);
}

static void stall_end(pthread_t th, int lanes)
{
	atomic_store(&st.stop, 1);
	pthread_join(th, NULL);
	pthread_barrier_destroy(&bar);
	unsetenv("NCCL_RAIL_RMA_STALL_WARN");
	free(st.src);
	if (r0.fail[0])
		fail_msg("%s", r0.fail);
	fake_leave(lanes);
}

/* Read exactly n bytes of fd (into a sink). */
static void drain(int fd, size_t n)
{
	static char sink[1 << 16];

	while (n) {
		ssize_t got = recv(fd, sink, RAIL_MIN(sizeof(sink), n), 0);

		assert_true(got > 0);
		n -= (size_t)got;
	}
}

/* Wait up to ms for rank 0's put or get to end (st.put_done: 1 done, -1 failed). */
static int put_wait(int ms)
{
	for (int i = 0; i < ms / 10 && !atomic_load(&st.put_done); i++)
		usleep(10000);
	return atomic_load(&st.put_done);
}

/*
 * Rank 1 does not read rank 0's stream: once the socket is full, rank 0
 * names the put, the peer and what was written; once rank 1 reads it all,
 * the stream moves again (an INFO line) and the put completes.
 */
static void test_stall_out_named(void **state)
{
	pthread_t th;

	(void)state;
	stall_start(STALL_OUT, 0, &th);
	if (!logged_within(RAIL_LOG_WARN, "RMA iput to rank 1 (127.0.0.1:", "(context 0, rank 0 "
			   "of 2, device 0): no byte of it has left for ", 5000)) {
		unit_log_dump();
		fail_msg("no stall line for the put rank 1 does not read");
	}
	unit_assert_logged2(RAIL_LOG_WARN, "of its 33554472 bytes written, 0 operations queued "
			    "behind it): the target does not read this stream", NULL);
	assert_int_equal(atomic_load(&st.put_done), 0);
	drain(f.in[0], RMA_FRAME_SIZE + BIG);
	if (!logged_within(RAIL_LOG_INFO, "context 0's stream to rank 1", "moves again after",
			   5000)) {
		unit_log_dump();
		fail_msg("no line for the stream moving again");
	}
	assert_int_equal(put_wait(5000), 1);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "no byte of it has left"), 1);
	stall_end(th, 0);
}

/*
 * With lanes: a signal whose striped put's block never comes holds context
 * 0's stream at its gate, and a block whose STRIPED frame never comes holds
 * lane 1: both are named after 1 s; once the block comes, the stream goes
 * on (INFO) and the signal lands.
 */
static void test_stall_gates_named(void **state)
{
	static char evil[64];
	pthread_t th;
	uint64_t until;

	(void)state;
	memset(evil, 0xee, sizeof(evil));
	stall_start(STALL_GATE, LANES, &th);
	fake_frame(f.out[0], RMA_OP_STRIPED, 0, 0, 16, NULL, 0);
	fake_frame(f.out[0], RMA_OP_SIGNAL, 1, 0, 1, NULL, 0);
	fake_block(f.lout[1], 2, 5, 0, RMA_LANE_BLOCK, evil, 16);	/* context 2's frame 5 */
	if (!logged_within(RAIL_LOG_WARN, "context 0's stream from rank 1 (127.0.0.1:", " s at "
			   "its gate for the blocks of striped puts before its next frame (blocks "
			   "landed so far, per lane: 0 0)", 5000) ||
	    !logged_within(RAIL_LOG_WARN, "lane 1 from rank 1 (127.0.0.1:", " s at its gate for "
			   "context 2's stream to reach the striped put its block belongs to (0 "
			   "frames of that stream applied)", 5000)) {
		unit_log_dump();
		fail_msg("no stall line for a gate");
	}
	assert_int_equal(r0.sig[0], 0);
	fake_block(f.lout[0], 0, 0, 0, 0, evil, 16);
	until = rail_now_ns() + 5000000000ull;
	while (__atomic_load_n(&r0.sig[0], __ATOMIC_ACQUIRE) != 1 && rail_now_ns() < until)
		usleep(1000);
	assert_int_equal(r0.sig[0], 1);
	assert_memory_equal(st.src, evil, 16);
	if (!logged_within(RAIL_LOG_INFO, "a stream's frame from rank 1", "goes on after", 5000)) {
		unit_log_dump();
		fail_msg("no line for the stream going on");
	}
	stall_end(th, LANES);
}

/*
 * The same put striped over 2 lanes that rank 1 does not read: each lane's
 * sender names its lane and the peer after 1 s; once rank 1 reads both,
 * each says it moves again and the put completes.
 */
static void test_stall_lanes_named(void **state)
{
	size_t per_lane = (BIG / RMA_LANE_BLOCK / LANES) * (RMA_FRAME_SIZE + RMA_LANE_BLOCK);
	pthread_t th;

	(void)state;
	stall_start(STALL_OUT, LANES, &th);
	for (int l = 0; l < LANES; l++) {
		char lane[48];

		snprintf(lane, sizeof(lane), "lane %d to rank 1 (127.0.0.1:", l);
		if (!logged_within(RAIL_LOG_WARN, lane, " s: the target does not read it", 5000)) {
			unit_log_dump();
			fail_msg("no stall line for lane %d", l);
		}
	}
	assert_int_equal(atomic_load(&st.put_done), 0);
	/* rank 0's threads by name: its appliers (main and per lane), senders, the check */
	assert_int_equal(unit_threads_named("rail-rma-rx"), 1 + LANES);
	assert_int_equal(unit_threads_named("rail-rma-tx"), LANES);
	assert_int_equal(unit_threads_named("rail-rma-watch"), 1);
	for (int l = 0; l < LANES; l++)
		drain(f.lin[l], per_lane);
	assert_int_equal(put_wait(5000), 1);
	unit_assert_logged2(RAIL_LOG_INFO, "lane 0 to rank 1", "moves again after");
	unit_assert_logged2(RAIL_LOG_INFO, "lane 1 to rank 1", "moves again after");
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "took no byte for"), LANES);
	stall_end(th, LANES);
}

/*
 * A get rank 1 does not answer: rank 0 names it after 1 s; once rank 1
 * replies, rank 0 says the reply came and the get completes with its bytes.
 */
static void test_stall_get_named(void **state)
{
	uint8_t b[RMA_FRAME_SIZE];
	struct rma_frame get;
	char why[160];
	pthread_t th;

	(void)state;
	stall_start(STALL_GET, 0, &th);
	assert_int_equal(rail_sock_recv_all(f.in[0], b, sizeof(b)), 0);
	assert_int_equal(rma_frame_decode(b, &get, why, sizeof(why)), 0);
	assert_int_equal(get.op, RMA_OP_GET);
	if (!logged_within(RAIL_LOG_WARN, "RMA iget of 8 bytes from rank 1 (127.0.0.1:", "(context "
			   "0, rank 0 of 2, device 0): no reply for ", 5000)) {
		unit_log_dump();
		fail_msg("no stall line for the get");
	}
	assert_int_equal(atomic_load(&st.put_done), 0);
	{
		struct rma_frame rep = { .op = RMA_OP_REPLY, .id = get.id, .len = 8 };

		rma_frame_encode(&rep, b);
		assert_int_equal(rail_sock_send_all(f.in[0], b, sizeof(b)), 0);
		assert_int_equal(rail_sock_send_all(f.in[0], "8 bytes!", 8), 0);
	}
	assert_int_equal(put_wait(5000), 1);
	assert_memory_equal(st.src, "8 bytes!", 8);
	unit_assert_logged2(RAIL_LOG_INFO, "RMA iget of 8 bytes from rank 1", "its reply came "
			    "after");
	stall_end(th, 0);
}

/*
 * A lane closed under a striped put (rank 1, joined with 2 lanes, closes
 * the socket of rank 0's lane 0 after a first read, and never reads lane
 * 1): the put fails within seconds instead of waiting for lane 1 forever,
 * and rank 0 names the put, the peer and the lane.
 */
static void test_lane_closed_mid_put(void **state)
{
	char b[4096];
	pthread_t th;

	(void)state;
	stall_start(STALL_OUT, LANES, &th);
	assert_true(recv(f.lin[0], b, sizeof(b), 0) > 0);	/* the put is under way */
	close(f.lin[0]);
	f.lin[0] = open("/dev/null", O_RDONLY);	/* fake_leave closes it */
	if (put_wait(10000) != -1) {
		unit_log_dump();
		fail_msg("the put is %s 10 s after its lane closed",
			 atomic_load(&st.put_done) ? "done" : "still in flight");
	}
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput of ", "to rank 1 (127.0.0.1:");
	unit_assert_logged2(RAIL_LOG_WARN, "writing lane 0: ", "every operation of this context "
			    "call to that rank fails");
	stall_end(th, LANES);
}

/*
 * The stream under a striped put fails (rank 1 resets rank 0's stream of
 * context 0, and reads neither lane): whichever thread meets the reset
 * first (the applier reading the stream, or NCCL's thread writing it) fails
 * the peer, and the put, whose blocks sat on the lanes, fails instead of
 * waiting for them.
 */
static void test_stream_failed_mid_put(void **state)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	pthread_t th;

	(void)state;
	stall_start(STALL_OUT, LANES, &th);
	{
		struct pollfd p = { .fd = f.lin[0], .events = POLLIN };

		assert_int_equal(poll(&p, 1, 5000), 1);	/* the put is under way */
	}
	setsockopt(f.in[0], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(f.in[0]);		/* a reset */
	f.in[0] = open("/dev/null", O_RDONLY);	/* fake_leave closes it */
	for (int i = 0; i < 1000 && !atomic_load(&st.put_done); i++) {
		if (i % 50 == 0)
			atomic_store(&st.second, 1);	/* writes on the stream until one fails */
		usleep(10000);
	}
	if (atomic_load(&st.put_done) != -1) {
		unit_log_dump();
		fail_msg("the striped put is %s 10 s after its stream failed",
			 atomic_load(&st.put_done) ? "done" : "still in flight");
	}
	/* named by whichever thread met the reset first: NCCL's writing, or the applier reading */
	if (!unit_log_count2(RAIL_LOG_WARN, "writing context 0's stream to rank 1 (127.0.0.1:",
			     "every operation of this context call to that rank fails") &&
	    !unit_log_count2(RAIL_LOG_WARN, "context 0's outgoing stream with rank 1 (127.0.0.1:",
			     "failed: ")) {
		unit_log_dump();
		fail_msg("the stream's failure is not named");
	}
	stall_end(th, LANES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_decode),
		cmocka_unit_test(test_hello_and_record_decode),
		cmocka_unit_test(test_hostile_peer),
		cmocka_unit_test(test_reply_for_no_get),
		cmocka_unit_test(test_reply_before_request),
		cmocka_unit_test(test_hostile_lanes),
		cmocka_unit_test(test_stall_out_named),
		cmocka_unit_test(test_stall_gates_named),
		cmocka_unit_test(test_stall_lanes_named),
		cmocka_unit_test(test_stall_get_named),
		cmocka_unit_test(test_lane_closed_mid_put),
		cmocka_unit_test(test_stream_failed_mid_put),
	};

	alarm(120);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
