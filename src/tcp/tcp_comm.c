/*
 * nccl-net-rail: what every file of the TCP transport needs of a comm, below
 * all that make or move one: the ops table a new comm carries (set by
 * tcp_init.c at init: the table names the functions of every layer, so it
 * sits at the top), the name of its device, its first error (recorded and
 * logged once), and a path failure set aside for a move (tcp_move.c).
 */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"
#include "rail.h"
#include "tcp/tcp.h"

/* The ops table, set by the layer above at init (tcp_comm_ops_set). */
static const struct rail_transport_ops *comm_ops;

void tcp_comm_ops_set(const struct rail_transport_ops *ops)
{
	comm_ops = ops;
}

const struct rail_transport_ops *tcp_comm_ops(void)
{
	return comm_ops;
}

const char *tcp_comm_dev_name(const struct tcp_comm *c)
{
	const struct tcp_dev *d = tcp_dev_get(c->base.dev);

	return d ? d->name : "?";
}

int tcp_comm_fail(struct tcp_comm *c, int err, const char *fmt, ...)
{
	int expected = 0;
	char msg[512];
	va_list ap;

	/*
	 * The WARN goes out before the error is published: a caller that sees
	 * the error (test() on another thread) must find it in the log already.
	 */
	if (!atomic_load(&c->error) && !atomic_load(&c->closing) &&
	    atomic_compare_exchange_strong(&c->warned, &expected, 1)) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		RAIL_WARN("%s comm on %s, peer %s: %s", c->is_send ? "send" : "receive",
			  tcp_comm_dev_name(c), c->peer, msg);
	}
	expected = 0;
	atomic_compare_exchange_strong(&c->error, &expected, err);
	return err;
}

int tcp_path_error(int err)
{
	return err == -EHOSTUNREACH || err == -ENETUNREACH || err == -ENETDOWN ||
	       err == -ETIMEDOUT || err == -EHOSTDOWN;
}

int tcp_path_failed(struct tcp_comm *c, int err)
{
	int none = 0;

	if (!c->fo || !tcp_path_error(err))
		return 0;
	atomic_compare_exchange_strong(&c->path_err, &none, err);
	return 1;
}
