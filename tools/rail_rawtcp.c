/*
 * rail-rawtcp: the loopback TCP ceiling that rail-bench is compared with.
 *
 *   rail-rawtcp [-P STREAMS] [-s SECONDS] [-l CALL_SIZE] [-x] [-a ADDR]
 *   rail-rawtcp --version
 *
 * Opens STREAMS TCP connections to itself (default over 127.0.0.1), one
 * sender and one receiver thread per stream (in two processes, like two
 * nodes), moves data for SECONDS with CALL_SIZE send/recv calls and prints
 * the total one-way GB/s. -x sends both ways at once on separate
 * connections (per-direction GB/s), as in a two-rank all-reduce.
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rail.h"

#define RAW_MAX_STREAMS 64

struct raw_stream {
	int fd;
	int is_send;
	size_t call;
	double seconds;
	uint64_t bytes;
};

static void *raw_run(void *arg)
{
	struct raw_stream *st = arg;
	char *buf = malloc(st->call);
	uint64_t end = rail_now_ns() + (uint64_t)(st->seconds * 1e9);

	memset(buf, 0x5a, st->call);
	for (;;) {
		ssize_t n = st->is_send ? send(st->fd, buf, st->call, MSG_NOSIGNAL)
					: recv(st->fd, buf, st->call, 0);

		if (n <= 0)
			break;
		st->bytes += (uint64_t)n;
		if (st->is_send && rail_now_ns() > end)
			break;
	}
	if (st->is_send)
		shutdown(st->fd, SHUT_WR);
	free(buf);
	return NULL;
}

/* Run nthreads streams in this process; returns total bytes moved. */
static uint64_t raw_side(int *fds, int n, int is_send_mask, size_t call, double seconds,
			 double *elapsed)
{
	struct raw_stream st[RAW_MAX_STREAMS * 2];
	pthread_t th[RAW_MAX_STREAMS * 2];
	uint64_t total = 0, t0 = rail_now_ns();

	for (int i = 0; i < n; i++) {
		st[i] = (struct raw_stream){ fds[i], (is_send_mask >> (i & 1)) & 1, call, seconds, 0 };
		pthread_create(&th[i], NULL, raw_run, &st[i]);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		if (!st[i].is_send)
			total += st[i].bytes;
	}
	*elapsed = (double)(rail_now_ns() - t0) / 1e9;
	return total;
}

int main(int argc, char **argv)
{
	int streams = 4, bidir = 0, opt, lfd, one = 1, pipefd[2];
	double seconds = 3;
	size_t call = 1 << 20;
	const char *addr = "127.0.0.1";
	int a_fds[RAW_MAX_STREAMS * 2], b_fds[RAW_MAX_STREAMS * 2], nconn;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);

	static const struct option longopts[] = {
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};

	while ((opt = getopt_long(argc, argv, "P:s:l:xa:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'P': streams = atoi(optarg); break;
		case 's': seconds = atof(optarg); break;
		case 'l': call = (size_t)atol(optarg); break;
		case 'x': bidir = 1; break;
		case 'a': addr = optarg; break;
		case 'V': printf("rail-rawtcp (nccl-net-rail) %s\n", RAIL_VERSION_STRING); return 0;
		default:
			printf("usage: rail-rawtcp [-P STREAMS] [-s SECONDS] [-l CALL_SIZE] [-x] [-a ADDR] "
			       "| --version\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (streams < 1 || streams > RAW_MAX_STREAMS || call == 0)
		return 2;
	nconn = streams * (bidir ? 2 : 1);
	inet_pton(AF_INET, addr, &sa.sin_addr);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 256) ||
	    getsockname(lfd, (struct sockaddr *)&sa, &len)) {
		perror("rail-rawtcp: listen");
		return 1;
	}
	for (int i = 0; i < nconn; i++) {
		a_fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(a_fds[i], (struct sockaddr *)&sa, sizeof(sa))) {
			perror("rail-rawtcp: connect");
			return 1;
		}
		b_fds[i] = accept(lfd, NULL, NULL);
		setsockopt(a_fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		setsockopt(b_fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	if (pipe(pipefd))
		return 1;
	if (fork() == 0) {
		double el;
		/* Process B: receives on even connections, sends on odd ones (-x). */
		uint64_t got = raw_side(b_fds, nconn, bidir ? 2 : 0, call, seconds, &el);

		if (write(pipefd[1], &got, sizeof(got)) != sizeof(got))
			_exit(1);
		_exit(0);
	} else {
		double el;
		uint64_t got_a = raw_side(a_fds, nconn, bidir ? 1 : 3, call, seconds, &el), got_b = 0;
		int status;

		if (read(pipefd[0], &got_b, sizeof(got_b)) != sizeof(got_b))
			return 1;
		wait(&status);
		printf("rail-rawtcp: %d stream(s)%s, %zu-byte calls, %.1f s: %.2f GB/s%s\n", streams,
		       bidir ? " each way" : "", call, el,
		       (double)(got_a + got_b) / el / 1e9 / (bidir ? 2 : 1),
		       bidir ? " per direction" : "");
	}
	return 0;
}
