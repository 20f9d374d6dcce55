/* nccl-net-rail unit tests: addresses and non-blocking sockets (src/sock.c). */
#include "unit.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rail.h"
#include "sock.h"

#define WAIT_MS 5000

static union rail_sockaddr parse_ok(const char *text)
{
	union rail_sockaddr a;
	int err;

	memset(&a, 0x5a, sizeof(a));
	err = rail_sockaddr_parse(text, &a);
	if (err)
		fail_msg("'%s' rejected: %d", text, err);
	return a;
}

static void parse_bad(const char *text)
{
	union rail_sockaddr a, before;
	int err;

	memset(&a, 0x5a, sizeof(a));
	before = a;
	err = rail_sockaddr_parse(text, &a);
	if (err != -EINVAL)
		fail_msg("'%s' returned %d, expected -EINVAL (parsed as %s)", text, err,
			 err ? "?" : RAIL_ADDRSTR(&a));
	if (memcmp(&a, &before, sizeof(a)))
		fail_msg("'%s': output written on failure", text);
}

static void test_parse_ipv4(void **state)
{
	union rail_sockaddr a;
	struct in_addr want;

	(void)state;
	a = parse_ok("1.2.3.4");
	assert_int_equal(a.sa.sa_family, AF_INET);
	inet_pton(AF_INET, "1.2.3.4", &want);
	assert_memory_equal(&a.sin.sin_addr, &want, 4);
	assert_int_equal(rail_sockaddr_port(&a), 0);
	assert_int_equal(rail_sockaddr_len(&a), sizeof(struct sockaddr_in));

	a = parse_ok("1.2.3.4:80");
	assert_int_equal(a.sa.sa_family, AF_INET);
	assert_memory_equal(&a.sin.sin_addr, &want, 4);
	assert_int_equal(rail_sockaddr_port(&a), 80);
	assert_int_equal(a.sin.sin_port, htons(80)); /* network order inside */

	a = parse_ok("255.255.255.255:65535");
	assert_int_equal(rail_sockaddr_port(&a), 65535);
	a = parse_ok("0.0.0.0:0");
	assert_int_equal(a.sin.sin_addr.s_addr, htonl(INADDR_ANY));
}

static void test_parse_ipv6(void **state)
{
	union rail_sockaddr a;

	(void)state;
	a = parse_ok("[::1]:9");
	assert_int_equal(a.sa.sa_family, AF_INET6);
	assert_memory_equal(&a.sin6.sin6_addr, &in6addr_loopback, 16);
	assert_int_equal(rail_sockaddr_port(&a), 9);
	assert_int_equal(a.sin6.sin6_scope_id, 0);
	assert_int_equal(rail_sockaddr_len(&a), sizeof(struct sockaddr_in6));

	a = parse_ok("[::1]");
	assert_int_equal(a.sa.sa_family, AF_INET6);
	assert_int_equal(rail_sockaddr_port(&a), 0);

	/* Without brackets an IPv6 address has no port. */
	a = parse_ok("::1");
	assert_int_equal(a.sa.sa_family, AF_INET6);
	assert_memory_equal(&a.sin6.sin6_addr, &in6addr_loopback, 16);
	assert_int_equal(rail_sockaddr_port(&a), 0);

	a = parse_ok("[2001:db8::42]:65535");
	assert_int_equal(rail_sockaddr_port(&a), 65535);
	assert_int_equal(a.sin6.sin6_addr.s6_addr[0], 0x20);
	assert_int_equal(a.sin6.sin6_addr.s6_addr[15], 0x42);
}

static void test_parse_scope(void **state)
{
	union rail_sockaddr a;
	unsigned lo = if_nametoindex("lo");

	(void)state;
	if (!lo)
		skip(); /* no loopback interface named lo in this environment */
	a = parse_ok("[fe80::1%lo]:7");
	assert_int_equal(a.sa.sa_family, AF_INET6);
	assert_int_equal(a.sin6.sin6_scope_id, lo);
	assert_int_equal(rail_sockaddr_port(&a), 7);
	assert_int_equal(a.sin6.sin6_addr.s6_addr[0], 0xfe);
	assert_int_equal(a.sin6.sin6_addr.s6_addr[1], 0x80);
	assert_int_equal(a.sin6.sin6_addr.s6_addr[15], 0x01);

	a = parse_ok("fe80::1%lo");
	assert_int_equal(a.sin6.sin6_scope_id, lo);
	assert_int_equal(rail_sockaddr_port(&a), 0);
}

static void test_parse_junk(void **state)
{
	static const char *const junk[] = {
		"",
		"abc",
		"localhost",
		"1.2.3",
		"1.2.3.4.5",
		"256.1.1.1",
		"1.2.3.4:",
		"1.2.3.4:x",
		"1.2.3.4:80x",
		"1.2.3.4:65536",
		"1.2.3.4:-1",
		"1.2.3.4:99999999999999999999",
		"1.2.3.4:80:90",
		":80",
		"[::1",
		"[::1]x",
		"[::1]:",
		"[::1]:abc",
		"[::1]:65536",
		"[]:80",
		"[]",
		"[abc]:80",
		"::1::2",
		"[::1]]:80",
	};

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(junk); i++)
		parse_bad(junk[i]);
}

/* Text longer than any address must be refused, not copied past a buffer. */
static void test_parse_long(void **state)
{
	char text[512];

	(void)state;
	memset(text, '1', sizeof(text) - 1);
	text[sizeof(text) - 1] = '\0';
	parse_bad(text);
	/* one colon far beyond any host buffer */
	text[400] = ':';
	parse_bad(text);
	text[400] = '1';
	text[0] = '[';
	text[300] = ']';
	text[301] = ':';
	text[302] = '\0';
	parse_bad(text);
}

static void roundtrip(const char *text)
{
	union rail_sockaddr a = parse_ok(text), b;
	char buf[RAIL_ADDR_STRLEN];

	assert_ptr_equal(rail_sockaddr_str(&a, buf, sizeof(buf)), buf);
	if (strcmp(buf, text))
		fail_msg("'%s' printed as '%s'", text, buf);
	b = parse_ok(buf);
	assert_memory_equal(&a, &b, rail_sockaddr_len(&a));
}

static void test_str_roundtrip(void **state)
{
	union rail_sockaddr a;

	(void)state;
	roundtrip("1.2.3.4:80");
	roundtrip("0.0.0.0:0");
	roundtrip("255.255.255.255:65535");
	roundtrip("[::1]:9");
	roundtrip("[2001:db8::42]:65535");
	roundtrip("[::ffff:10.0.0.1]:1234");
	if (if_nametoindex("lo"))
		roundtrip("[fe80::1%lo]:7");
	/* No port given prints port 0. */
	a = parse_ok("1.2.3.4");
	assert_string_equal(RAIL_ADDRSTR(&a), "1.2.3.4:0");
	/* Nothing to print. */
	memset(&a, 0, sizeof(a));
	assert_string_equal(RAIL_ADDRSTR(&a), "(no address)");
	/* Truncated output stays terminated. */
	{
		char small[6];

		a = parse_ok("10.20.30.40:5000");
		rail_sockaddr_str(&a, small, sizeof(small));
		assert_string_equal(small, "10.20");
	}
}

static void test_port_helpers(void **state)
{
	union rail_sockaddr a = parse_ok("10.0.0.1:1");

	(void)state;
	rail_sockaddr_set_port(&a, 43122);
	assert_int_equal(rail_sockaddr_port(&a), 43122);
	assert_string_equal(RAIL_ADDRSTR(&a), "10.0.0.1:43122");
	a = parse_ok("[::1]:1");
	rail_sockaddr_set_port(&a, 65535);
	assert_int_equal(rail_sockaddr_port(&a), 65535);
	assert_string_equal(RAIL_ADDRSTR(&a), "[::1]:65535");
}

/* ---- live sockets on loopback ------------------------------------------ */

static int wait_connected(int fd)
{
	for (int ms = 0; ms < WAIT_MS; ms++) {
		int err = rail_sock_connect_done(fd);

		if (err != -EAGAIN)
			return err;
		poll(NULL, 0, 1);
	}
	return -ETIMEDOUT;
}

static int wait_accept(int lfd, int *fd, union rail_sockaddr *peer)
{
	for (int ms = 0; ms < WAIT_MS; ms++) {
		int err = rail_sock_accept(lfd, fd, peer);

		if (err != -EAGAIN)
			return err;
		poll(NULL, 0, 1);
	}
	return -ETIMEDOUT;
}

static int wait_recv(int fd, void *buf, size_t len, size_t *off)
{
	for (int ms = 0; ms < WAIT_MS; ms++) {
		int err = rail_sock_recv_nb(fd, buf, len, off);

		if (err != -EAGAIN)
			return err;
		poll(NULL, 0, 1);
	}
	return -ETIMEDOUT;
}

struct conn {
	int lfd, cfd, afd;
	union rail_sockaddr bound, peer;
};

/* listen + non-blocking connect + accept on a loopback address. */
static int open_pair(const char *loopback, struct conn *c)
{
	union rail_sockaddr addr = parse_ok(loopback);
	int fd = -1;
	int err;

	err = rail_sock_listen(&addr, 4, &c->lfd, &c->bound);
	if (err)
		return err;
	assert_int_equal(c->bound.sa.sa_family, addr.sa.sa_family);
	assert_int_not_equal(rail_sockaddr_port(&c->bound), 0);
	/* Nothing pending yet. */
	assert_int_equal(rail_sock_accept(c->lfd, &fd, &c->peer), -EAGAIN);
	assert_int_equal(fd, -1);
	assert_int_equal(rail_sock_connect_start(&c->bound, &c->cfd), 0);
	assert_int_equal(wait_connected(c->cfd), 0);
	assert_int_equal(wait_accept(c->lfd, &c->afd, &c->peer), 0);
	assert_int_equal(c->peer.sa.sa_family, addr.sa.sa_family);
	return 0;
}

static void close_pair(struct conn *c)
{
	if (c->cfd >= 0)
		close(c->cfd);
	if (c->afd >= 0)
		close(c->afd);
	close(c->lfd);
}

static void exchange(struct conn *c)
{
	char out[] = "hello rail", in[sizeof(out)] = "";
	size_t soff = 0, roff = 0;

	/* Both ends are non-blocking. */
	assert_int_equal(rail_sock_recv_nb(c->afd, in, sizeof(in), &roff), -EAGAIN);
	assert_int_equal(roff, 0);
	assert_int_equal(rail_sock_send_nb(c->cfd, out, sizeof(out), &soff), 0);
	assert_int_equal(soff, sizeof(out));
	assert_int_equal(wait_recv(c->afd, in, sizeof(in), &roff), 0);
	assert_int_equal(roff, sizeof(in));
	assert_memory_equal(in, out, sizeof(out));

	/* A partial message: the offset says how far it got. */
	soff = 0;
	assert_int_equal(rail_sock_send_nb(c->afd, "abc", 3, &soff), 0);
	roff = 0;
	memset(in, 0, sizeof(in));
	for (int ms = 0; ms < WAIT_MS && roff < 3; ms++) {
		assert_int_equal(rail_sock_recv_nb(c->cfd, in, 8, &roff), -EAGAIN);
		if (roff < 3)
			poll(NULL, 0, 1);
	}
	assert_int_equal(roff, 3);
	assert_memory_equal(in, "abc", 3);
	/* The rest arrives later; the call continues at the offset. */
	soff = 0;
	assert_int_equal(rail_sock_send_nb(c->afd, "defgh", 5, &soff), 0);
	assert_int_equal(wait_recv(c->cfd, in, 8, &roff), 0);
	assert_int_equal(roff, 8);
	assert_memory_equal(in, "abcdefgh", 8);

	/* Peer closes: EOF says so (not "Connection reset by peer"). */
	close(c->cfd);
	c->cfd = -1;
	roff = 0;
	assert_int_equal(wait_recv(c->afd, in, 4, &roff), -RAIL_ECLOSED);
	assert_string_equal(RAIL_ERRSTR(-RAIL_ECLOSED), "the peer closed the connection");
	assert_int_equal(roff, 0);
}

static void test_loopback_ipv4(void **state)
{
	struct conn c = { -1, -1, -1, { .sa = { 0 } }, { .sa = { 0 } } };

	(void)state;
	assert_int_equal(open_pair("127.0.0.1:0", &c), 0);
	assert_string_equal(inet_ntoa(c.peer.sin.sin_addr), "127.0.0.1");
	exchange(&c);
	close_pair(&c);
}

static void test_loopback_ipv6(void **state)
{
	struct conn c = { -1, -1, -1, { .sa = { 0 } }, { .sa = { 0 } } };
	int err;

	(void)state;
	err = open_pair("[::1]:0", &c);
	if (err == -EADDRNOTAVAIL || err == -EAFNOSUPPORT) {
		print_message("skipped: no IPv6 loopback (%s)\n", RAIL_ERRSTR(err));
		skip();
	}
	assert_int_equal(err, 0);
	assert_memory_equal(&c.peer.sin6.sin6_addr, &in6addr_loopback, 16);
	exchange(&c);
	close_pair(&c);
}

static void test_connect_refused(void **state)
{
	union rail_sockaddr addr = parse_ok("127.0.0.1:0"), bound;
	int lfd, fd = -1, err;

	(void)state;
	/* A port that was just free: bind, note it, close. */
	assert_int_equal(rail_sock_listen(&addr, 1, &lfd, &bound), 0);
	close(lfd);
	err = rail_sock_connect_start(&bound, &fd);
	if (err == 0) {
		err = wait_connected(fd);
		close(fd);
	}
	assert_int_equal(err, -ECONNREFUSED);
}

static void split_ok(const char *text, const char *host, int port)
{
	char h[64];
	int p = -1, err = rail_hostport_split(text, h, sizeof(h), &p);

	if (err || strcmp(h, host) || p != port)
		fail_msg("'%s': err %d host '%s' port %d, expected '%s' %d", text, err,
			 err ? "" : h, p, host, port);
}

static void test_hostport_split(void **state)
{
	char h[8];
	int p = 7;

	(void)state;
	split_ok("5000", "", 5000);
	split_ok("10.0.0.2:5000", "10.0.0.2", 5000);
	split_ok("node-7.example:1", "node-7.example", 1);
	split_ok("[fe80::1%eth0]:65535", "fe80::1%eth0", 65535);
	assert_int_equal(rail_hostport_split("fe80::1:5000", h, sizeof(h), &p), -EDESTADDRREQ);
	assert_int_equal(rail_hostport_split("host", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("host:", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("host:0", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("host:65536", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("host:50x", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("[::1]5000", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("[::1:5000", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(rail_hostport_split("a-very-long-host:5", h, sizeof(h), &p), -EINVAL);
	assert_int_equal(p, 7); /* untouched on failure */
}

/* Refused: at once without retries, at the deadline (not before) with them. */
static void test_connect_by_refused(void **state)
{
	union rail_sockaddr addr = parse_ok("127.0.0.1:0"), bound;
	uint64_t t0;
	int lfd, fd = -1;

	(void)state;
	assert_int_equal(rail_sock_listen(&addr, 1, &lfd, &bound), 0);
	close(lfd);
	t0 = rail_now_ns();
	assert_int_equal(rail_sock_connect_by(&bound, t0 + 2000000000ull, 0, &fd), -ECONNREFUSED);
	assert_true(rail_now_ns() - t0 < 1000000000ull);
	t0 = rail_now_ns();
	assert_int_equal(rail_sock_connect_by(&bound, t0 + 500000000ull, 1, &fd), -ECONNREFUSED);
	assert_true(rail_now_ns() - t0 >= 300000000ull);
	assert_int_equal(fd, -1);
}

/* A server that starts listening while the client retries is reached. */
static void test_connect_by_late_server(void **state)
{
	union rail_sockaddr addr = parse_ok("127.0.0.1:0"), bound, peer;
	int lfd, fd = -1, afd = -1;
	pid_t pid;

	(void)state;
	assert_int_equal(rail_sock_listen(&addr, 1, &lfd, &bound), 0);
	close(lfd);
	pid = fork();
	if (pid == 0) {
		usleep(300000);
		if (rail_sock_listen(&bound, 1, &lfd, &peer) ||
		    rail_sock_accept_wait(lfd, WAIT_MS, &afd, &peer))
			_exit(1);
		_exit(0);
	}
	assert_int_equal(rail_sock_connect_by(&bound, rail_now_ns() + 5000000000ull, 1, &fd), 0);
	close(fd);
	assert_int_equal(waitpid(pid, &afd, 0), pid);
	assert_true(WIFEXITED(afd) && WEXITSTATUS(afd) == 0);
}

static void test_accept_wait_timeout(void **state)
{
	union rail_sockaddr addr = parse_ok("127.0.0.1:0"), bound, peer;
	int lfd, fd = -1;
	uint64_t t0;

	(void)state;
	assert_int_equal(rail_sock_listen(&addr, 1, &lfd, &bound), 0);
	t0 = rail_now_ns();
	assert_int_equal(rail_sock_accept_wait(lfd, 200, &fd, &peer), -ETIMEDOUT);
	assert_true(rail_now_ns() - t0 >= 150000000ull);
	assert_int_equal(fd, -1);
	close(lfd);
}

static void test_listen_in_use(void **state)
{
	union rail_sockaddr addr = parse_ok("127.0.0.1:0"), bound, bound2;
	int lfd, lfd2 = -1;

	(void)state;
	assert_int_equal(rail_sock_listen(&addr, 1, &lfd, &bound), 0);
	assert_int_equal(rail_sock_listen(&bound, 1, &lfd2, &bound2), -EADDRINUSE);
	assert_int_equal(lfd2, -1);
	close(lfd);
}

static void test_send_to_closed_peer(void **state)
{
	struct conn c = { -1, -1, -1, { .sa = { 0 } }, { .sa = { 0 } } };
	static char chunk[65536];
	int err = 0;

	(void)state;
	assert_int_equal(open_pair("127.0.0.1:0", &c), 0);
	close(c.afd);
	c.afd = -1;
	/* The first sends may still be accepted; then the reset shows (no SIGPIPE). */
	for (int i = 0; i < 1000 && !err; i++) {
		size_t off = 0;

		err = rail_sock_send_nb(c.cfd, chunk, sizeof(chunk), &off);
		if (err == -EAGAIN) {
			err = 0;
			poll(NULL, 0, 1);
		}
	}
	if (err != -EPIPE && err != -ECONNRESET)
		fail_msg("send to a closed peer returned %d (%s)", err, RAIL_ERRSTR(err));
	close_pair(&c);
}

struct bulk {
	int fd;
	const unsigned char *buf;
	size_t len;
	int err;
};

static void *bulk_sender(void *arg)
{
	struct bulk *b = arg;

	b->err = rail_sock_send_all(b->fd, b->buf, b->len);
	return NULL;
}

/* The blocking helpers move more than a socket buffer holds. */
static void test_send_recv_all(void **state)
{
	struct conn c = { -1, -1, -1, { .sa = { 0 } }, { .sa = { 0 } } };
	const size_t len = 8u << 20;
	unsigned char *src = malloc(len), *dst = calloc(1, len);
	struct bulk b;
	pthread_t t;

	(void)state;
	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < len; i++)
		src[i] = (unsigned char)(i * 131 + (i >> 12));
	assert_int_equal(open_pair("127.0.0.1:0", &c), 0);
	b.fd = c.cfd;
	b.buf = src;
	b.len = len;
	b.err = 1;
	assert_int_equal(pthread_create(&t, NULL, bulk_sender, &b), 0);
	assert_int_equal(rail_sock_recv_all(c.afd, dst, len), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(b.err, 0);
	assert_memory_equal(src, dst, len);
	/* EOF while waiting for more. */
	close(c.cfd);
	c.cfd = -1;
	assert_int_equal(rail_sock_recv_all(c.afd, dst, 16), -RAIL_ECLOSED);
	close_pair(&c);
	free(src);
	free(dst);
}

static void test_nonblocking_flag(void **state)
{
	union rail_sockaddr addr = parse_ok("127.0.0.1:0"), bound;
	int lfd, fl;

	(void)state;
	assert_int_equal(rail_sock_listen(&addr, 1, &lfd, &bound), 0);
	fl = fcntl(lfd, F_GETFL);
	assert_true(fl & O_NONBLOCK);
	assert_int_equal(rail_sock_set_nonblocking(lfd, 0), 0);
	assert_false(fcntl(lfd, F_GETFL) & O_NONBLOCK);
	assert_int_equal(rail_sock_set_nonblocking(lfd, 1), 0);
	assert_true(fcntl(lfd, F_GETFL) & O_NONBLOCK);
	close(lfd);
	assert_int_equal(rail_sock_set_nonblocking(lfd, 1), -EBADF);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_ipv4),
		cmocka_unit_test(test_parse_ipv6),
		cmocka_unit_test(test_parse_scope),
		cmocka_unit_test(test_parse_junk),
		cmocka_unit_test(test_parse_long),
		cmocka_unit_test(test_str_roundtrip),
		cmocka_unit_test(test_port_helpers),
		cmocka_unit_test(test_loopback_ipv4),
		cmocka_unit_test(test_loopback_ipv6),
		cmocka_unit_test(test_connect_refused),
		cmocka_unit_test(test_listen_in_use),
		cmocka_unit_test(test_hostport_split),
		cmocka_unit_test(test_connect_by_refused),
		cmocka_unit_test(test_connect_by_late_server),
		cmocka_unit_test(test_accept_wait_timeout),
		cmocka_unit_test(test_send_to_closed_peer),
		cmocka_unit_test(test_send_recv_all),
		cmocka_unit_test(test_nonblocking_flag),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
