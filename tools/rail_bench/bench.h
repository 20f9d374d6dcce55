/*
 * rail-bench's parts: the run options, one side's state, the hello both
 * sides exchange, and the control connection (rail_bench/oob.c).
 */
#ifndef RAIL_BENCH_BENCH_H
#define RAIL_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>

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
	uint64_t total;	/* --total: bytes to move one way (0: the size sweep) */
	size_t msg;	/* --msg: message size of --total */
	int verify;	/* --verify: every byte of --total checked */
	double timeout;	/* seconds to wait for the peer, or for progress */
	uint64_t corrupt; /* --corrupt: 1 + the stream offset of a byte the sender flips */
	const char *server, *client;
	int cpu, peer_cpu;	/* --cpus A,B: CPUs to pin this process and the forked peer to (-1: none) */
	const char *csv;	/* --csv FILE: the sweep's rows as CSV too (this side only) */
};

#define BENCH_MAX_COMMS 64
#define BENCH_MAX_WINDOW 64
#define BENCH_HELLO_SIZE 1024
#define BENCH_NOPTS 17

struct bench_side {
	int role; /* 0 = A (server: starts the ping, sends), 1 = B (client) */
	int oob;  /* out-of-band socket to the peer */
	int dev;
	int across;	/* --server/--client: both sides print */
	char peer_addr[RAIL_ADDR_STRLEN];
	int ncomms;
	void *ctx;
	void *send[BENCH_MAX_COMMS], *recv[BENCH_MAX_COMMS];
	void *smh[BENCH_MAX_COMMS], *rmh[BENCH_MAX_COMMS];
	void *sbuf, *rbuf;
	size_t slen, rlen;
	char peer_data[160]; /* the peer's data address, from its handle */
};

/* What each side tells the other before anything else. */
struct bench_hello {
	uint32_t role;
	uint64_t opt[BENCH_NOPTS];
	struct { char version[32], transport[16], host[64], dev[256]; } str;
};

/* Send len bytes and receive len bytes on the control connection; exits on loss. */
void bench_oob_xchg(int fd, const void *out, void *in, size_t len);
void bench_oob_barrier(int fd);
/* The user's --server/--client text: host (or "") and port; -1 after a message. */
int bench_split_endpoint(const char *opt, const char *text, char *host, size_t hlen, int *port);
/* --server / --client: set up s->oob (and role, peer_addr); -1 after a message. */
int bench_oob_setup(const struct bench_opts *o, struct bench_side *s);
/* Tell the peer who we are; a client's options become the server's. Exits on a mismatch. */
void bench_hello_exchange(struct bench_side *s, struct bench_opts *o, const char *transport,
			  const char *dev, struct bench_hello *peer);

#endif
