/*
 * Live tests of the TCP failover rescue path (src/tcp/tcp_rescue.c and
 * tcp_move.c, docs/FAILOVER.md section 6) against hostile peers. Each runs
 * in a child process inside a private network namespace with two
 * interfaces (two veth pairs: uta0 10.99.0.1 and uta1 10.99.1.1; the send
 * and the receive comm in the same process); without root or ip(8) they
 * SKIP, saying why.
 *
 * - strangers: an idle connection to every rescue port of the process,
 *   then uta0 goes down mid-transfer: the comms move within the usual
 *   time, every byte right, and finalize returns at once;
 * - forged move: a stranger who saw one hello (conn_id and nonce) dials the
 *   receive comm's rescue listener as if it were the sender, answering the
 *   challenge with a made-up proof, with a proof replayed from an earlier
 *   exchange, or not at all: refused (a line naming its address), the comm
 *   unchanged, NCCL's receive gets the real bytes;
 * - forged "please move": the same towards the send comm's rescue listener;
 * - flood: more strangers than the rescue thread keeps (idle, garbage,
 *   bad proofs): a move still happens, with a bounded number of WARN lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "unit.h"

#include "api.h"
#include "handles.h"
#include "rail.h"
#include "tcp/tcp.h"

#define SKIPPED 77
#define MSG (1u << 20)

static char sbuf[MSG], rbuf[MSG];

static int sh(const char *cmd)
{
	int r = system(cmd);

	return r == 0 ? 0 : -1;
}

static int if_running(const char *name)
{
	struct ifreq ifr;
	int fd = socket(AF_INET, SOCK_DGRAM, 0), ok;

	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_RUNNING);
	if (fd >= 0)
		close(fd);
	return ok;
}

/* A private network namespace with uta0 and uta1 running; 0, or SKIPPED saying why. */
static int netns_enter(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "SKIP: needs root (a private network namespace)\n");
		return SKIPPED;
	}
	if (unshare(CLONE_NEWNET)) {
		fprintf(stderr, "SKIP: unshare(CLONE_NEWNET): %s\n", strerror(errno));
		return SKIPPED;
	}
	if (sh("command -v ip >/dev/null") ||
	    sh("ip link set lo up && ip link add uta0 type veth peer name utb0 && "
	       "ip link add uta1 type veth peer name utb1 && "
	       "ip addr add 10.99.0.1/24 dev uta0 && ip addr add 10.99.1.1/24 dev uta1 && "
	       "ip link set utb0 up && ip link set utb1 up && "
	       "ip link set uta0 up && ip link set uta1 up")) {
		fprintf(stderr, "SKIP: no ip(8), or it cannot make veth pairs\n");
		return SKIPPED;
	}
	for (int i = 0; i < 100 && !(if_running("uta0") && if_running("uta1")); i++)
		usleep(50000);
	if (!if_running("uta0") || !if_running("uta1")) {
		fprintf(stderr, "the veth pairs have no carrier after 5 s\n");
		return 2;
	}
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "=uta0,uta1", 1);
	setenv("NCCL_RAIL_FAILOVER", "1", 1);
	return 0;
}

/* Run fn in a child process in its own namespace; fails the test with what it printed. */
static void run_child(int (*fn)(void), const char *what, unsigned alarm_s)
{
	int status = 0, rc;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(alarm_s);
		rc = netns_enter();
		_exit(rc ? rc : fn());
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFSIGNALED(status))
		fail_msg("%s: the child died of signal %d (%u s alarm: a hang)", what,
			 WTERMSIG(status), alarm_s);
	if (WEXITSTATUS(status) == SKIPPED)
		skip();
	if (WEXITSTATUS(status))
		fail_msg("%s failed (exit %d; its reasons are on stderr above)", what,
			 WEXITSTATUS(status));
}

/* The plugin's lines captured so far, on stderr (a check failed). */
static void log_dump(void)
{
	pthread_mutex_lock(&unit_log_mu);
	for (int i = 0; i < unit_log_rec.n; i++)
		fprintf(stderr, "  log| %s%s\n", unit_log_rec.lines[i].level == RAIL_LOG_WARN ?
			"WARN " : "", unit_log_rec.lines[i].text);
	pthread_mutex_unlock(&unit_log_mu);
}

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "FAILED %s:%d: ", __func__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                      \
			fprintf(stderr, "\n");                             \
			log_dump();                                        \
			return 1;                                          \
		}                                                          \
	} while (0)

struct pair {
	void *ctx, *lc, *sc, *rc;
	struct tcp_comm *s, *r;
};

static struct tcp_comm *comm_ptr(void *h)
{
	uint32_t kind = 0;

	return rail_h_get(RAIL_HT_COMM, (uintptr_t)h, &kind);
}

static int pair_open(struct pair *p)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	uint64_t until = rail_now_ns() + 10000000000ull;

	memset(p, 0, sizeof(*p));
	if (rail_net_init(&p->ctx, 1, -1, unit_log_sink, 12) != ncclSuccess ||
	    rail_net_listen(p->ctx, 0, handle, &p->lc) != ncclSuccess)
		return -1;
	while ((!p->sc || !p->rc) && rail_now_ns() < until) {
		if (!p->sc && rail_net_connect(p->ctx, 0, -1, handle, &p->sc) != ncclSuccess)
			return -1;
		if (!p->rc && rail_net_accept(p->lc, &p->rc) != ncclSuccess)
			return -1;
	}
	if (!p->sc || !p->rc)
		return -1;
	p->s = comm_ptr(p->sc);
	p->r = comm_ptr(p->rc);
	return p->s && p->r && p->s->fo && p->r->fo ? 0 : -1;
}

static void pair_close(struct pair *p)
{
	rail_net_close_send(p->sc);
	rail_net_close_recv(p->rc);
	rail_net_close_listen(p->lc);
}

static void fill(char *b, size_t len, unsigned k)
{
	for (size_t i = 0; i < len; i++)
		b[i] = (char)(i * 7 + k * 131 + (i >> 12));
}

/*
 * One message of len bytes (tag 1) from the send to the receive comm, with
 * the receive posted first; 0 when the receiver got exactly sbuf, else -1.
 * hook (may be NULL) runs between calls.
 */
static int one_message(struct pair *p, size_t len, unsigned k, uint64_t deadline,
		       void (*hook)(void *), void *arg)
{
	void *data[1] = { rbuf }, *sreq = NULL, *rreq = NULL;
	size_t room[1] = { len };
	int tag[1] = { 1 }, sdone = 0, rdone = 0, size = 0;

	fill(sbuf, len, k);
	memset(rbuf, 0, len);
	while (!rreq && rail_now_ns() < deadline) {
		if (rail_net_irecv(p->rc, 1, data, room, tag, NULL, &rreq) != ncclSuccess)
			return -1;
		if (hook)
			hook(arg);
	}
	while (!sreq && rail_now_ns() < deadline)
		if (rail_net_isend(p->sc, sbuf, len, 1, NULL, &sreq) != ncclSuccess)
			return -1;
	while ((!sdone || !rdone) && rail_now_ns() < deadline) {
		if (!sdone && rail_net_test(sreq, &sdone, &size) != ncclSuccess)
			return -1;
		if (!rdone && rail_net_test(rreq, &rdone, &size) != ncclSuccess)
			return -1;
		/*
		 * A send completes once acknowledged, and a move stops it: the receive comm
		 * must answer the move, as NCCL's next irecv or test on it would (this loop
		 * posts the next receive only when the send is done).
		 */
		if (rdone && !sdone && tcp_move_due(p->r) && tcp_move_recv(p->r))
			return -1;
		if (hook)
			hook(arg);
	}
	if (!sdone || !rdone) {
		fprintf(stderr, "message %u (%zu bytes) not done by the deadline (send %d, receive "
			"%d)\n", k, len, sdone, rdone);
		return -1;
	}
	if (memcmp(sbuf, rbuf, len)) {
		fprintf(stderr, "message %u: the receive holds other bytes than were sent (\"%.8s\")\n",
			k, rbuf);
		return -1;
	}
	return 0;
}

/* An idle TCP connection to every rescue listener of this process; the count. */
static int strangers_open(int *fds, int max)
{
	struct tcp_rescue mine;
	int n = 0;

	tcp_rescue_mine(&mine);
	for (int i = 0; i < mine.count && n < max; i++) {
		int fd = socket(mine.addr[i].sa.sa_family, SOCK_STREAM, 0);

		if (fd < 0 || connect(fd, &mine.addr[i].sa, rail_sockaddr_len(&mine.addr[i]))) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		fds[n++] = fd;
	}
	return n;
}

static double ms_since(uint64_t t0)
{
	return (double)(rail_now_ns() - t0) / 1e6;
}

/* Messages of len bytes until the send comm logs its move (or 10 s); ms since t_down. */
static double until_moved_len(struct pair *p, uint64_t t_down, unsigned *k, size_t len)
{
	uint64_t until = t_down + 10000000000ull;

	while (rail_now_ns() < until) {
		if (unit_log_count2(RAIL_LOG_WARN, "send comm to peer", "moved from uta0") > 0)
			return ms_since(t_down);
		if (one_message(p, len, (*k)++, until, NULL, NULL))
			return -1;
	}
	return -1;
}

static double until_moved(struct pair *p, uint64_t t_down, unsigned *k)
{
	return until_moved_len(p, t_down, k, MSG);
}

/*
 * Lazy data sockets: a comm that carried only small messages moves its
 * control socket alone when uta0 goes down; its first large message after
 * the move opens the data sockets on the new path (uta1), every byte right.
 */
static int move_before_open_main(void)
{
	struct pair p;
	unsigned k = 0;
	double moved_ms;

	unit_log_capture();
	CHECK(pair_open(&p) == 0, "the send and receive comms (failover on) were not set up");
	for (int i = 0; i < 8; i++)
		CHECK(one_message(&p, 1000, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "small message %u before the fault", k - 1);
	CHECK(p.s->nsocks == 0 && p.r->nsocks == 0, "data sockets open after small messages only "
	      "(send %d, receive %d)", p.s->nsocks, p.r->nsocks);
	CHECK(sh("ip link set uta0 down") == 0, "ip link set uta0 down failed");
	moved_ms = until_moved_len(&p, rail_now_ns(), &k, 1000);
	CHECK(moved_ms >= 0, "no move of the control socket within 10 s of uta0 going down");
	CHECK(p.s->nsocks == 0 && p.r->nsocks == 0, "data sockets opened by the move (send %d, "
	      "receive %d)", p.s->nsocks, p.r->nsocks);
	for (int i = 0; i < 4; i++)
		CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "large message %u after the move", k - 1);
	CHECK(p.s->nsocks > 0 && p.r->nsocks == p.s->nsocks, "after large messages: %d data "
	      "sockets on the send comm, %d on the receive comm", p.s->nsocks, p.r->nsocks);
	fprintf(stderr, "move before open: moved %.1f ms after uta0 went down; then %d data "
		"sockets opened\n", moved_ms, p.s->nsocks);
	pair_close(&p);
	rail_net_finalize(p.ctx);
	unit_log_release();
	return 0;
}

/*
 * Messages above the inline limit that go inline (NCCL_RAIL_TCP_DIRECT, the
 * frame's INLINE flag: 40 KiB, one at a time, nothing else queued) through a
 * move: their bytes sit in the control stream's ring until acknowledged, and
 * those the old path lost are written again on uta1. Every byte right, and
 * the data sockets never open (a receiver that took such a frame for a
 * data-socket one would wait for them).
 */
#define IDLE_INLINE (40u << 10)
static int move_idle_inline_main(void)
{
	struct pair p;
	unsigned k = 0;
	uint64_t inl0;
	double moved_ms;

	unit_log_capture();
	CHECK(pair_open(&p) == 0, "the send and receive comms (failover on) were not set up");
	CHECK(p.s->inline_max < IDLE_INLINE && p.s->direct_max >= IDLE_INLINE, "inline limit %zu, "
	      "NCCL_RAIL_TCP_DIRECT %zu: a %u-byte message is not between them", p.s->inline_max,
	      p.s->direct_max, IDLE_INLINE);
	inl0 = tcp_data_idle_inline();
	for (int i = 0; i < 8; i++)
		CHECK(one_message(&p, IDLE_INLINE, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "message %u before the fault", k - 1);
	CHECK(tcp_data_idle_inline() - inl0 == 8, "%llu of 8 messages of %u bytes went inline",
	      (unsigned long long)(tcp_data_idle_inline() - inl0), IDLE_INLINE);
	CHECK(sh("ip link set uta0 down") == 0, "ip link set uta0 down failed");
	moved_ms = until_moved_len(&p, rail_now_ns(), &k, IDLE_INLINE);
	CHECK(moved_ms >= 0, "no move within 10 s of uta0 going down");
	for (int i = 0; i < 8; i++)
		CHECK(one_message(&p, IDLE_INLINE, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "message %u after the move", k - 1);
	CHECK(p.s->nsocks == 0 && p.r->nsocks == 0, "data sockets opened (send %d, receive %d) "
	      "for messages that all went inline", p.s->nsocks, p.r->nsocks);
	fprintf(stderr, "move with inline messages above the limit: moved %.1f ms after uta0 went "
		"down; %u messages of %u bytes, every byte right\n", moved_ms, k, IDLE_INLINE);
	pair_close(&p);
	rail_net_finalize(p.ctx);
	unit_log_release();
	return 0;
}

static void test_move_idle_inline(void **state)
{
	(void)state;
	run_child(move_idle_inline_main, "a move with inline messages above the limit", 60);
}

/*
 * A move racing the open: the first large message starts the open of the
 * data sockets, and uta0 goes down before the open is driven further (the
 * open progresses only in isend/test). The move drops the open, moves the
 * control socket, and the open starts again on uta1: the message arrives
 * whole, and the comm carries large messages after.
 */
/* Test a send and a receive until both are done (10 s); 0, or -1. */
static int finish_pair(struct pair *p, void *sreq, void *rreq)
{
	uint64_t until = rail_now_ns() + 10000000000ull;
	int sdone = 0, rdone = 0, size = 0;

	while ((!sdone || !rdone) && rail_now_ns() < until) {
		if (!sdone && rail_net_test(sreq, &sdone, &size) != ncclSuccess)
			return -1;
		if (!rdone && rail_net_test(rreq, &rdone, &size) != ncclSuccess)
			return -1;
		if (tcp_move_due(p->r) && tcp_move_recv(p->r))
			return -1;
	}
	return sdone && rdone ? 0 : -1;
}

/* A new pair, a small message, then a large one posted: 1 when it waits for the open. */
static int pair_held(struct pair *p, unsigned k, void **sreq, void **rreq)
{
	void *data[1] = { rbuf };
	size_t room[1] = { MSG };
	int tag[1] = { 1 };

	*sreq = *rreq = NULL;
	if (pair_open(p) || one_message(p, 1000, k, rail_now_ns() + 5000000000ull, NULL, NULL))
		return -1;
	fill(sbuf, MSG, k + 1);
	memset(rbuf, 0, MSG);
	if (rail_net_irecv(p->rc, 1, data, room, tag, NULL, rreq) != ncclSuccess || !*rreq ||
	    rail_net_isend(p->sc, sbuf, MSG, 1, NULL, sreq) != ncclSuccess || !*sreq)
		return -1;
	return p->s->nsocks == 0 && p->s->held == 1;
}

/*
 * A move racing the open: the first large message starts the open of the
 * data sockets, and uta0 goes down before the open is driven further (the
 * open progresses only in isend/test). The move drops the open, moves the
 * control socket, and the open starts again on uta1: the message arrives
 * whole, and the comm carries large messages after. (Where the open was
 * done within the isend already, a new pair tries again.)
 */
static int move_during_open_main(void)
{
	void *sreq = NULL, *rreq = NULL;
	struct pair p;
	unsigned k = 0;
	int held = 0;

	unit_log_capture();
	for (int attempt = 0; attempt < 10 && held != 1; attempt++) {
		held = pair_held(&p, k, &sreq, &rreq);
		CHECK(held >= 0, "setting up a pair and its first large message failed");
		k += 2;
		if (held)
			break;
		CHECK(finish_pair(&p, sreq, rreq) == 0, "a large message (no fault)");
		pair_close(&p);
		rail_net_finalize(p.ctx);
	}
	CHECK(held == 1, "the open completed within the isend on 10 pairs in a row");
	CHECK(sh("ip link set uta0 down") == 0, "ip link set uta0 down failed");
	usleep(200000);	/* the link watch sees it before the open goes on */
	CHECK(finish_pair(&p, sreq, rreq) == 0, "the message posted during the open not done in "
	      "10 s");
	CHECK(memcmp(sbuf, rbuf, MSG) == 0, "the message posted during the open arrived wrong");
	CHECK(unit_log_count2(RAIL_LOG_WARN, "moved from uta0", "0 bytes on 0 data sockets") > 0,
	      "no move of the control socket alone logged (the open was not dropped for it)");
	for (int i = 0; i < 4; i++)
		CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "large message %u after the move", k - 1);
	CHECK(p.s->nsocks > 0 && p.r->nsocks == p.s->nsocks, "%d data sockets on the send comm, "
	      "%d on the receive comm", p.s->nsocks, p.r->nsocks);
	fprintf(stderr, "move during open: the message arrived; %d data sockets open after "
		"the move\n", p.s->nsocks);
	pair_close(&p);
	rail_net_finalize(p.ctx);
	unit_log_release();
	return 0;
}

static void test_move_during_open(void **state)
{
	(void)state;
	run_child(move_during_open_main, "a move racing the open of the data sockets", 60);
}

static void test_move_before_open(void **state)
{
	(void)state;
	run_child(move_before_open_main, "a move before the data sockets open", 60);
}

/*
 * A stranger holds an idle connection to every rescue port (as a port
 * scanner or a health check would); then uta0 goes down mid-transfer. The
 * comms must move within the usual time, and finalize must return at once.
 */
static int strangers_main(void)
{
	struct pair p;
	int strangers[TCP_RESCUE_MAX], n;
	unsigned k = 0;
	uint64_t t_down, t0;
	double moved_ms, fin_ms;

	unit_log_capture();
	CHECK(pair_open(&p) == 0, "the send and receive comms (failover on) were not set up");
	n = strangers_open(strangers, TCP_RESCUE_MAX);
	CHECK(n == 2, "%d strangers connected to the 2 rescue listeners", n);
	usleep(100000);
	for (int i = 0; i < 8; i++)
		CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "message %u before the fault", k - 1);
	CHECK(sh("ip link set uta0 down") == 0, "ip link set uta0 down failed");
	t_down = rail_now_ns();
	moved_ms = until_moved(&p, t_down, &k);
	CHECK(moved_ms >= 0, "no move within 10 s of uta0 going down, with a stranger idle on "
	      "each rescue port (the rescue thread waits on it: no link watch)");
	for (int i = 0; i < 4; i++)
		CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "message %u after the move", k - 1);
	fprintf(stderr, "strangers: the send comm moved %.1f ms after uta0 went down\n", moved_ms);
	CHECK(moved_ms < 2000, "the move took %.1f ms (usually a few ms)", moved_ms);
	pair_close(&p);
	t0 = rail_now_ns();
	rail_net_finalize(p.ctx);
	fin_ms = ms_since(t0);
	fprintf(stderr, "strangers: finalize took %.1f ms with the strangers still connected\n",
		fin_ms);
	CHECK(fin_ms < 1000, "finalize took %.1f ms", fin_ms);
	for (int i = 0; i < n; i++)
		close(strangers[i]);
	unit_log_release();
	return 0;
}

static void test_strangers_do_not_stop_the_move(void **state)
{
	(void)state;
	run_child(strangers_main, "strangers on every rescue port, then the move", 60);
}

/* Finalize with a stranger idle on every rescue port and nothing else going on. */
static int finalize_main(void)
{
	struct pair p;
	int strangers[TCP_RESCUE_MAX], n;
	uint64_t t0;
	double fin_ms;

	unit_log_capture();
	CHECK(pair_open(&p) == 0, "the send and receive comms (failover on) were not set up");
	CHECK(one_message(&p, MSG, 1, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
	      "the first message");
	n = strangers_open(strangers, TCP_RESCUE_MAX);
	CHECK(n == 2, "%d strangers connected to the 2 rescue listeners", n);
	usleep(100000);
	pair_close(&p);
	t0 = rail_now_ns();
	rail_net_finalize(p.ctx);
	fin_ms = ms_since(t0);
	CHECK(fin_ms < 1000, "finalize took %.1f ms with a stranger idle on each rescue port",
	      fin_ms);
	for (int i = 0; i < n; i++)
		close(strangers[i]);
	unit_log_release();
	return 0;
}

static void test_finalize_with_strangers(void **state)
{
	(void)state;
	run_child(finalize_main, "finalize with a stranger on every rescue port", 20);
}

/* ---- a stranger who saw one hello: conn_id, nonce, layout ---- */

/* What the stranger answers to the listener's challenge. */
enum forge_mode {
	FORGE_MADE_UP,	/* a proof of its own making */
	FORGE_REPLAY,	/* the proof of an earlier exchange it recorded (a right one, then) */
	FORGE_SILENT,	/* nothing: it sends its hellos and waits */
	FORGE_GUESS,	/* a hello naming a conn_id it guessed */
};

struct forger {
	int fds[TCP_MAX_SOCKS + 1];
	int n;
	int challenged;		/* sockets the listener challenged */
	int refused;		/* sockets the listener closed after the proof */
	char addr[TCP_MAX_SOCKS + 1][RAIL_ADDR_STRLEN];	/* local addresses, as logged */
	int frame_sent;
	uint64_t seq;
};

/* The rescue address of this process on uta1 (the interface the comms do not run on). */
static const union rail_sockaddr *rescue_on_uta1(struct tcp_rescue *mine)
{
	union rail_sockaddr want;

	tcp_rescue_mine(mine);
	rail_sockaddr_parse("10.99.1.1", &want);
	for (int i = 0; i < mine->count; i++)
		if (tcp_same_ip(&mine->addr[i], &want))
			return &mine->addr[i];
	return NULL;
}

/* len bytes within ms: len, 0 at end of file, -1 on timeout or error. */
static ssize_t read_within(int fd, void *buf, size_t len, int ms)
{
	size_t off = 0;

	while (off < len) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, ms) != 1)
			return -1;
		n = recv(fd, (char *)buf + off, len - off, 0);
		if (n <= 0)
			return n;
		off += (size_t)n;
	}
	return (ssize_t)off;
}

/* The stranger's answer to socket i's challenge (rnd is the listener's fresh random). */
static void forged_proof(const struct tcp_comm *victim, enum forge_mode mode,
			 const uint8_t *hello, uint8_t proof[TCP_MOVE_PROOF_SIZE])
{
	uint8_t mac[TCP_MAC_SIZE], old[TCP_MOVE_RAND_SIZE];

	if (mode == FORGE_REPLAY) {
		/* Recorded from an earlier exchange: the right proof for that exchange's challenge. */
		memset(old, 0x11, sizeof(old));
		tcp_move_mac(victim->key, TCP_ROLE_MOVER, hello, old, mac);
	} else {
		memset(mac, 0x33, sizeof(mac));
	}
	tcp_move_proof_encode(mac, proof);
}

/*
 * n connections to the rescue listener on uta1, each with a move hello of
 * the given kind for (conn_id, nonce) as seen on the wire, answered as mode
 * says. Then it notes which the listener challenged and which it closed.
 */
static int forger_dial(struct forger *f, const struct tcp_comm *victim, int kind, int n,
		       enum forge_mode mode)
{
	struct tcp_move_hello h = { .kind = kind, .nsocks = (uint16_t)victim->nsocks, .gen = 7,
				    .nonce = victim->nonce, .conn_id = victim->conn_id };
	uint8_t hello[TCP_MAX_SOCKS + 1][TCP_MOVE_HELLO_SIZE], chal[TCP_MOVE_CHALLENGE_SIZE];
	uint8_t proof[TCP_MOVE_PROOF_SIZE];
	struct tcp_rescue mine;
	const union rail_sockaddr *to = rescue_on_uta1(&mine);

	memset(f, 0, sizeof(*f));
	if (!to)
		return -1;
	if (mode == FORGE_GUESS)
		h.conn_id = rail_random64();
	memset(h.rand, 0x5a, sizeof(h.rand));	/* the recorded hellos' */
	for (int i = 0; i < n; i++) {
		union rail_sockaddr me;
		socklen_t sl = sizeof(me);
		int fd = socket(to->sa.sa_family, SOCK_STREAM, 0);

		if (fd < 0 || connect(fd, &to->sa, rail_sockaddr_len(to)))
			return -1;
		f->fds[f->n++] = fd;
		if (getsockname(fd, &me.sa, &sl) == 0)
			rail_sockaddr_str(&me, f->addr[i], sizeof(f->addr[i]));
		h.index = (uint16_t)i;
		tcp_move_hello_encode(&h, hello[i]);
		if (send(fd, hello[i], TCP_MOVE_HELLO_SIZE, MSG_NOSIGNAL) != TCP_MOVE_HELLO_SIZE)
			return -1;
	}
	for (int i = 0; i < n; i++) {
		if (read_within(f->fds[i], chal, sizeof(chal), mode == FORGE_GUESS ? 1000 : 2000) !=
		    (ssize_t)sizeof(chal))
			continue;
		f->challenged++;
		if (mode == FORGE_SILENT)
			continue;
		forged_proof(victim, mode, hello[i], proof);
		if (send(f->fds[i], proof, sizeof(proof), MSG_NOSIGNAL) != (ssize_t)sizeof(proof))
			return -1;
	}
	for (int i = 0; i < n && mode != FORGE_SILENT; i++)
		f->refused += read_within(f->fds[i], chal, 1, 1000) == 0;
	return 0;
}

static void forger_close(struct forger *f)
{
	for (int i = 0; i < f->n; i++)
		close(f->fds[i]);
	f->n = 0;
}

/* A message small enough to travel inline, on the control socket. */
#define SMALL 4096

/*
 * Between NCCL's calls: if the receive comm answered the forger on its
 * socket 0 (it took the forged move), send a frame of its own: the next
 * message, SMALL bytes starting "FORGED!!".
 */
static void forger_hook(void *arg)
{
	struct forger *f = arg;
	struct pollfd pfd = { .fd = f->fds[0], .events = POLLIN };
	uint8_t junk[1024], frame[TCP_FRAME_SIZE];
	struct tcp_frame fr = { .seq = f->seq, .tag = 1, .size = SMALL };
	char evil[SMALL] = "FORGED!!";

	if (f->frame_sent || f->n == 0 || poll(&pfd, 1, 0) != 1 ||
	    recv(f->fds[0], junk, sizeof(junk), MSG_DONTWAIT) <= 0)
		return;
	tcp_frame_encode(&fr, frame);
	if (send(f->fds[0], frame, sizeof(frame), MSG_NOSIGNAL) == (ssize_t)sizeof(frame) &&
	    send(f->fds[0], evil, sizeof(evil), MSG_NOSIGNAL) == (ssize_t)sizeof(evil))
		f->frame_sent = 1;
}

/* Lines about the rescue listener that name one of the forger's addresses. */
static int logged_forger(const struct forger *f)
{
	int n = 0;

	for (int i = 0; i < f->n; i++)
		n += unit_log_count2(RAIL_LOG_INFO, "rescue listener", f->addr[i]) +
		     unit_log_count2(RAIL_LOG_WARN, "rescue listener", f->addr[i]);
	return n;
}

/* What the comms must still be after a refused forgery. */
static int unmoved(struct pair *p, int ctrl_fd, const char *after)
{
	CHECK(p->r->moves == 0 && p->s->moves == 0, "after %s: a comm moved (receive %d, send %d)",
	      after, p->r->moves, p->s->moves);
	CHECK(p->r->ctrl_fd == ctrl_fd, "after %s: the receive comm's control socket changed",
	      after);
	CHECK(atomic_load(&p->s->peer_kick) == 0, "after %s: the send comm took a request to move "
	      "(move number %u)", after, atomic_load(&p->s->peer_kick));
	CHECK(!unit_log_has(RAIL_LOG_WARN, "moved from"), "after %s: a move was logged", after);
	return 0;
}

static const char *const mode_name[] = { "a made-up proof", "a replayed proof", "no proof",
					  "a guessed conn_id" };

/*
 * One forgery of the given kind (the sockets of a move to the receive comm,
 * or a request to move to the send comm) answered as mode says: refused,
 * nothing changes, the next message carries the sender's bytes.
 */
static int forge_one(struct pair *p, int kind, enum forge_mode mode, unsigned *k)
{
	struct tcp_comm *victim = kind == TCP_MOVE_KICK ? p->s : p->r;
	int n = kind == TCP_MOVE_KICK ? 1 : victim->nsocks + 1, ctrl_fd = p->r->ctrl_fd;
	const char *what = mode_name[mode];
	struct forger f;

	CHECK(forger_dial(&f, victim, kind, n, mode) == 0,
	      "the forger could not reach the rescue listener on uta1");
	if (mode == FORGE_GUESS)
		CHECK(f.challenged == 0, "%s: the listener challenged a hello naming no comm", what);
	else
		CHECK(f.challenged == n && (mode == FORGE_SILENT || f.refused == n), "%s: the listener challenged %d and "
		      "closed %d of the %d sockets after the proof", what, f.challenged, f.refused, n);
	f.seq = p->r->seq;
	CHECK(one_message(p, SMALL, (*k)++, rail_now_ns() + 5000000000ull, forger_hook, &f) == 0,
	      "%s: the message after the forgery (the forger %s its own frame)", what,
	      f.frame_sent ? "was answered and sent" : "sent no");
	CHECK(!f.frame_sent, "%s: the receive comm answered the forged move", what);
	if (unmoved(p, ctrl_fd, what))
		return 1;
	if (mode == FORGE_MADE_UP || mode == FORGE_REPLAY || mode == FORGE_GUESS)
		CHECK(logged_forger(&f) > 0, "%s: no line about the rescue listener names the "
		      "forger (%s, ...)", what, f.addr[0]);
	if (mode == FORGE_MADE_UP)
		CHECK(unit_log_count2(RAIL_LOG_WARN, "rescue listener", "proof is wrong") == 1,
		      "%s: no WARN (or more than one) about a wrong proof", what);
	forger_close(&f);
	return 0;
}

/*
 * Forged moves by a stranger who knows the comms' conn_id and nonce (they
 * travel in clear in every hello): each refused, NCCL's next receive still
 * gets the sender's bytes, and no comm changes. kind: the sockets of a
 * move (to the receive comm), or a request to move (to the send comm).
 */
static int forge_main_kind(int kind)
{
	struct pair p;
	unsigned k = 0;

	unit_log_capture();
	CHECK(pair_open(&p) == 0, "the send and receive comms (failover on) were not set up");
	CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
	      "the first message");
	for (int mode = FORGE_MADE_UP; mode <= FORGE_GUESS; mode++)
		if (forge_one(&p, kind, (enum forge_mode)mode, &k))
			return 1;
	for (int i = 0; i < 4; i++)
		CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "message %u after the forgeries", k - 1);
	/* Only the first wrong proof of the window is a WARN. */
	CHECK(unit_log_count(RAIL_LOG_WARN, "rescue listener") == 1, "%d WARN lines about the "
	      "rescue listener", unit_log_count(RAIL_LOG_WARN, "rescue listener"));
	pair_close(&p);
	rail_net_finalize(p.ctx);
	unit_log_release();
	return 0;
}

static int forge_main(void)
{
	return forge_main_kind(TCP_MOVE_SOCKET);
}

static int kick_main(void)
{
	return forge_main_kind(TCP_MOVE_KICK);
}

static void test_forged_move_refused(void **state)
{
	(void)state;
	run_child(forge_main, "forged moves of the receive comm", 60);
}

static void test_forged_kick_refused(void **state)
{
	(void)state;
	run_child(kick_main, "forged requests to move to the send comm", 60);
}

/* ---- a flood ---- */

#define FLOOD_IDLE (TCP_RESCUE_PENDING + 100)
#define FLOOD_BAD 50

/*
 * More idle strangers than the rescue thread keeps, then strangers sending
 * garbage and strangers with a wrong proof, then uta0 goes down: the comms
 * still move, a bounded number of lines name strangers (one WARN), and
 * finalize returns at once.
 */
static int flood_main(void)
{
	static int idle[FLOOD_IDLE];
	struct rlimit rl = { .rlim_cur = 4096, .rlim_max = 4096 };
	struct tcp_rescue mine;
	struct forger bad;
	struct pair p;
	unsigned k = 0;
	uint64_t t_down, t0;
	double moved_ms, fin_ms;
	int lines;

	CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit(RLIMIT_NOFILE, 4096): %s",
	      strerror(errno));
	unit_log_capture();
	CHECK(pair_open(&p) == 0, "the send and receive comms (failover on) were not set up");
	tcp_rescue_mine(&mine);
	for (int i = 0; i < FLOOD_IDLE; i++) {
		const union rail_sockaddr *a = &mine.addr[i % mine.count];

		idle[i] = socket(a->sa.sa_family, SOCK_STREAM, 0);
		CHECK(idle[i] >= 0 && connect(idle[i], &a->sa, rail_sockaddr_len(a)) == 0,
		      "idle stranger %d: %s", i, strerror(errno));
	}
	for (int i = 0; i < FLOOD_BAD; i++) {
		CHECK(forger_dial(&bad, p.r, TCP_MOVE_SOCKET, 1, FORGE_MADE_UP) == 0, "forger %d", i);
		CHECK(send(bad.fds[0], "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL) >= 0, "garbage");
		forger_close(&bad);
	}
	usleep((useconds_t)(TCP_RESCUE_MIN_AGE_NS / 1000) + 100000);
	CHECK(sh("ip link set uta0 down") == 0, "ip link set uta0 down failed");
	t_down = rail_now_ns();
	moved_ms = until_moved(&p, t_down, &k);
	CHECK(moved_ms >= 0, "no move within 10 s of uta0 going down, with %d idle strangers and "
	      "%d with wrong proofs", FLOOD_IDLE, FLOOD_BAD);
	fprintf(stderr, "flood: the send comm moved %.1f ms after uta0 went down\n", moved_ms);
	for (int i = 0; i < 4; i++)
		CHECK(one_message(&p, MSG, k++, rail_now_ns() + 5000000000ull, NULL, NULL) == 0,
		      "message %u after the move", k - 1);
	lines = unit_log_count(RAIL_LOG_INFO, "rescue listener") +
		unit_log_count(RAIL_LOG_WARN, "rescue listener");
	CHECK(unit_log_count(RAIL_LOG_WARN, "rescue listener") <= 1 && lines <= 16,
	      "%d lines (%d WARN) about %d strangers", lines,
	      unit_log_count(RAIL_LOG_WARN, "rescue listener"), FLOOD_IDLE + FLOOD_BAD);
	pair_close(&p);
	t0 = rail_now_ns();
	rail_net_finalize(p.ctx);
	fin_ms = ms_since(t0);
	fprintf(stderr, "flood: %d lines about the strangers; finalize took %.1f ms\n", lines,
		fin_ms);
	CHECK(fin_ms < 1000, "finalize took %.1f ms", fin_ms);
	for (int i = 0; i < FLOOD_IDLE; i++)
		close(idle[i]);
	unit_log_release();
	return 0;
}

static void test_flood(void **state)
{
	(void)state;
	run_child(flood_main, "a flood of strangers on the rescue listeners", 60);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_move_before_open),
		cmocka_unit_test(test_move_idle_inline),
		cmocka_unit_test(test_move_during_open),
		cmocka_unit_test(test_finalize_with_strangers),
		cmocka_unit_test(test_strangers_do_not_stop_the_move),
		cmocka_unit_test(test_forged_move_refused),
		cmocka_unit_test(test_forged_kick_refused),
		cmocka_unit_test(test_flood),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
