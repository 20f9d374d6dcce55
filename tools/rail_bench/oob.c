/*
 * rail-bench's control connection: --server listens, --client connects
 * (both bounded by --timeout, with messages in the user's words), then both
 * sides exchange a hello (version, transport, host, device, and the
 * client's options, which the server adopts).
 */
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "rail.h"
#include "rail_bench/bench.h"
#include "sock.h"
#include "wire.h"

void bench_oob_xchg(int fd, const void *out, void *in, size_t len)
{
	if (rail_sock_send_all(fd, out, len) || rail_sock_recv_all(fd, in, len)) {
		fprintf(stderr, "rail-bench: the peer closed the control connection: it failed "
			"or was stopped (see its output)\n");
		exit(1);
	}
}

void bench_oob_barrier(int fd)
{
	char a = 'b', b;

	bench_oob_xchg(fd, &a, &b, 1);
}

static void opts_pack(const struct bench_opts *o, uint64_t *v)
{
	uint64_t a[BENCH_NOPTS] = {
		o->min_size, o->max_size, (uint64_t)o->factor, (uint64_t)o->iters,
		(uint64_t)o->warmup, (uint64_t)o->window, (uint64_t)o->check,
		(uint64_t)o->lat_only, (uint64_t)o->bw_only, (uint64_t)o->comms,
		(uint64_t)o->bidir, (uint64_t)(o->seconds * 1e6), o->total, o->msg,
		(uint64_t)o->verify, (uint64_t)(o->timeout * 1e3), o->corrupt,
	};

	memcpy(v, a, sizeof(a));
}

static void opts_unpack(const uint64_t *v, struct bench_opts *o)
{
	o->min_size = v[0], o->max_size = v[1], o->factor = (int)v[2], o->iters = (int)v[3];
	o->warmup = (int)v[4], o->window = (int)v[5], o->check = (int)v[6];
	o->lat_only = (int)v[7], o->bw_only = (int)v[8], o->comms = (int)v[9];
	o->bidir = (int)v[10], o->seconds = (double)v[11] / 1e6, o->total = v[12];
	o->msg = v[13], o->verify = (int)v[14], o->timeout = (double)v[15] / 1e3;
	o->corrupt = v[16];
}

static void hello_pack(const struct bench_hello *h, uint8_t *b)
{
	memset(b, 0, BENCH_HELLO_SIZE);
	memcpy(b, "RAILBNCH", 8);
	rail_put_u32(b + 8, 1);
	rail_put_u32(b + 12, h->role);
	for (int i = 0; i < BENCH_NOPTS; i++)
		rail_put_u64(b + 16 + 8 * i, h->opt[i]);
	memcpy(b + 16 + 8 * BENCH_NOPTS, &h->str, sizeof(h->str));
}

static int hello_unpack(const uint8_t *b, struct bench_hello *h)
{
	if (memcmp(b, "RAILBNCH", 8) || rail_get_u32(b + 8) != 1)
		return -EPROTO;
	h->role = rail_get_u32(b + 12);
	for (int i = 0; i < BENCH_NOPTS; i++)
		h->opt[i] = rail_get_u64(b + 16 + 8 * i);
	memcpy(&h->str, b + 16 + 8 * BENCH_NOPTS, sizeof(h->str));
	h->str.version[sizeof(h->str.version) - 1] = '\0';
	h->str.transport[sizeof(h->str.transport) - 1] = '\0';
	h->str.host[sizeof(h->str.host) - 1] = h->str.dev[sizeof(h->str.dev) - 1] = '\0';
	return 0;
}

/*
 * Tell the peer who we are; the client's run options become the server's.
 * Refuses a peer on another transport (the handles would not match).
 */
void bench_hello_exchange(struct bench_side *s, struct bench_opts *o, const char *transport,
			   const char *dev, struct bench_hello *peer)
{
	uint8_t out[BENCH_HELLO_SIZE], in[BENCH_HELLO_SIZE];
	struct bench_hello me = { .role = (uint32_t)s->role };

	rail_strlcpy(me.str.version, RAIL_VERSION_STRING, sizeof(me.str.version));
	rail_strlcpy(me.str.transport, transport, sizeof(me.str.transport));
	if (gethostname(me.str.host, sizeof(me.str.host)))
		rail_strlcpy(me.str.host, "?", sizeof(me.str.host));
	me.str.host[sizeof(me.str.host) - 1] = '\0';
	rail_strlcpy(me.str.dev, dev, sizeof(me.str.dev));
	opts_pack(o, me.opt);
	hello_pack(&me, out);
	bench_oob_xchg(s->oob, out, in, sizeof(out));
	if (hello_unpack(in, peer)) {
		fprintf(stderr, "rail-bench: the program at %s is not rail-bench (or a very different "
			"version): check the host and port\n", s->peer_addr);
		exit(1);
	}
	if (strcmp(peer->str.transport, transport)) {
		fprintf(stderr, "rail-bench: this side uses the %s transport but the peer (%s) uses %s: "
			"set NCCL_RAIL_TRANSPORT to the same value on both sides\n", transport,
			s->peer_addr, peer->str.transport);
		exit(1);
	}
	if (strcmp(peer->str.version, RAIL_VERSION_STRING))
		fprintf(stderr, "rail-bench: note: the peer runs nccl-net-rail %s, this side %s\n",
			peer->str.version, RAIL_VERSION_STRING);
	if (s->role == 0 && s->across)
		opts_unpack(peer->opt, o);
}

/* ---- the control connection (--server / --client) -------------------- */

static void oob_fail(const char *target, int port, int err)
{
	fprintf(stderr, "rail-bench: cannot reach %s: ", target);
	if (err == -ECONNREFUSED)
		fprintf(stderr, "connection refused (is `rail-bench --server %d` running there? "
			"firewall?)\n", port);
	else if (err == -ETIMEDOUT)
		fprintf(stderr, "no answer (wrong address, host down, or a firewall dropping "
			"packets?)\n");
	else if (err == -EHOSTUNREACH || err == -ENETUNREACH)
		fprintf(stderr, "no route to that host (check the address and this host's "
			"interfaces)\n");
	else
		fprintf(stderr, "%s\n", RAIL_ERRSTR(err));
}

/* The user's --server/--client text: host (or "") and port; -1 with a message. */
int bench_split_endpoint(const char *opt, const char *text, char *host, size_t hlen, int *port)
{
	int err = rail_hostport_split(text, host, hlen, port);

	if (err == -EDESTADDRREQ)
		fprintf(stderr, "rail-bench: %s %s: write an IPv6 address in brackets, as in "
			"[fe80::1%%eth0]:5000\n", opt, text);
	else if (err)
		fprintf(stderr, "rail-bench: %s %s: expected %s with a port number from 1 to "
			"65535\n", opt, text, !strcmp(opt, "--server") ? "PORT or ADDR:PORT" :
			"HOST:PORT");
	return err ? -1 : 0;
}

static int oob_listen(const char *spec, int *lfd)
{
	char host[256];
	union rail_sockaddr a, bound;
	int port, err;

	if (bench_split_endpoint("--server", spec, host, sizeof(host), &port))
		return -1;
	memset(&a, 0, sizeof(a));
	if (host[0] && rail_sockaddr_parse(host, &a)) {
		fprintf(stderr, "rail-bench: --server %s: '%s' is not an IP address of this host\n",
			spec, host);
		return -1;
	}
	if (!host[0])
		a.sin6.sin6_family = AF_INET6; /* every address, IPv4 too */
	rail_sockaddr_set_port(&a, port);
	err = rail_sock_listen(&a, 1, lfd, &bound);
	if (err == -EAFNOSUPPORT && !host[0]) { /* no IPv6 here */
		memset(&a, 0, sizeof(a));
		a.sin.sin_family = AF_INET;
		rail_sockaddr_set_port(&a, port);
		err = rail_sock_listen(&a, 1, lfd, &bound);
	}
	if (err) {
		fprintf(stderr, "rail-bench: cannot listen on %s port %d: %s%s\n",
			host[0] ? host : "every address,", port, RAIL_ERRSTR(err),
			err == -EADDRINUSE ? " (another server there? pick another port)"
			: err == -EADDRNOTAVAIL ? " (that address is not on this host)"
			: err == -EACCES ? " (ports below 1024 need root)" : "");
		return -1;
	}
	printf("# rail-bench: waiting for a client on port %d of %s (run `rail-bench --client "
	       "THIS_HOST:%d` on the other host)\n", port, host[0] ? host : "every address", port);
	fflush(stdout);
	return 0;
}

static int oob_server(const char *spec, double timeout, struct bench_side *s)
{
	union rail_sockaddr peer;
	int lfd, err;

	if (oob_listen(spec, &lfd))
		return -1;
	err = rail_sock_accept_wait(lfd, (int)(timeout * 1000), &s->oob, &peer);
	close(lfd);
	if (err) {
		fprintf(stderr, "rail-bench: no client connected within %.0f s%s%s\n", timeout,
			err == -ETIMEDOUT ? " (start `rail-bench --client HOST:PORT` on the other "
					    "host; firewall? --timeout waits longer)" : ": ",
			err == -ETIMEDOUT ? "" : RAIL_ERRSTR(err));
		return -1;
	}
	if (peer.sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&peer.sin6.sin6_addr)) {
		union rail_sockaddr v4 = { .sin = { .sin_family = AF_INET,
						    .sin_port = peer.sin6.sin6_port } };

		memcpy(&v4.sin.sin_addr, &peer.sin6.sin6_addr.s6_addr[12], 4);
		peer = v4;
	}
	rail_sockaddr_str(&peer, s->peer_addr, sizeof(s->peer_addr));
	s->role = 0;
	return 0;
}

static int oob_client(const char *spec, double timeout, struct bench_side *s)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	uint64_t deadline = rail_now_ns() + (uint64_t)(timeout * 1e9);
	char host[256], ports[16];
	int port, rc, err = -EHOSTUNREACH;

	if (bench_split_endpoint("--client", spec, host, sizeof(host), &port))
		return -1;
	if (!host[0]) {
		fprintf(stderr, "rail-bench: --client %s: give the server's host, as in "
			"--client 10.0.0.2:%d\n", spec, port);
		return -1;
	}
	snprintf(ports, sizeof(ports), "%d", port);
	printf("# rail-bench: connecting to %s (waiting up to %.0f s for the server)\n", spec,
	       timeout);
	fflush(stdout);
	rc = getaddrinfo(host, ports, &hints, &res);
	if (rc) {
		fprintf(stderr, "rail-bench: cannot resolve host '%s': %s (check the name, or give "
			"an IP address)\n", host, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai && err; ai = ai->ai_next) {
		union rail_sockaddr a;

		memset(&a, 0, sizeof(a));
		memcpy(&a, ai->ai_addr, RAIL_MIN((size_t)ai->ai_addrlen, sizeof(a)));
		err = rail_sock_connect_by(&a, deadline, 1, &s->oob);
	}
	freeaddrinfo(res);
	if (err) {
		oob_fail(spec, port, err);
		return -1;
	}
	snprintf(s->peer_addr, sizeof(s->peer_addr), "%s", spec);
	s->role = 1;
	return 0;
}

int bench_oob_setup(const struct bench_opts *o, struct bench_side *s)
{
	int err = o->server ? oob_server(o->server, o->timeout, s)
			    : oob_client(o->client, o->timeout, s);

	if (err)
		return err;
	s->across = 1;
	s->dev = o->dev;
	/* A peer host that vanishes without closing shows up as an error, not a hang. */
	rail_sock_set_liveness(s->oob, 30, 0);
	return rail_sock_set_nonblocking(s->oob, 0);
}
