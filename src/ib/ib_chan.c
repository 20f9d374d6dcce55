/*
 * nccl-net-rail: framed messages on a verbs comm's handshake socket after
 * the handshake (layer 2.2 of src/ib/, ib.h): the moves' MOVE and
 * MOVE_READY (ib_move.c) and the move back's probe (ib_probe.c) share it,
 * so one comm has one queue of bytes to send and one message being read,
 * whoever asks. Never blocks: a part sent or read stays for the next call.
 * The codecs are ib_wire.c's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"
#include "sock.h"

#define FRAME_MAX (RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX)

struct rail_ib_chan {
	uint8_t tx[2 * FRAME_MAX];	/* a move's message may queue behind a probe's */
	size_t tx_len, tx_off;
	uint8_t rx[FRAME_MAX];
	size_t rx_off;
	int rx_body;			/* the body's length once the header is in, else -1 */
	int sock_err;			/* the last error came from the socket */
};

int rail_ib_chan_open(struct rail_ib_comm *c)
{
	c->chan = calloc(1, sizeof(*c->chan));
	if (!c->chan)
		return -ENOMEM;
	c->chan->rx_body = -1;
	return 0;
}

void rail_ib_chan_close(struct rail_ib_comm *c)
{
	free(c->chan);
	c->chan = NULL;
}

int rail_ib_chan_put(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	struct rail_ib_chan *ch = c->chan;
	int n;

	if (ch->tx_off) {	/* what was sent makes room */
		memmove(ch->tx, ch->tx + ch->tx_off, ch->tx_len - ch->tx_off);
		ch->tx_len -= ch->tx_off;
		ch->tx_off = 0;
	}
	n = rail_ib_msg_encode(m, ch->tx + ch->tx_len, sizeof(ch->tx) - ch->tx_len);
	if (n < 0) {
		RAIL_WARN("connection to peer %s: message type %d for the handshake socket does not "
			  "encode (%d devices, %d QPs, %zu bytes queued): %s", c->peer, m->type,
			  m->ndevs, m->nqps, ch->tx_len, RAIL_ERRSTR(n));
		return n;
	}
	ch->tx_len += (size_t)n;
	return 0;
}

int rail_ib_chan_flush(struct rail_ib_comm *c)
{
	struct rail_ib_chan *ch = c->chan;
	int err;

	if (ch->tx_off == ch->tx_len)
		return 0;
	err = rail_sock_send_nb(c->oob_fd, ch->tx, ch->tx_len, &ch->tx_off);
	ch->sock_err = err && err != -EAGAIN;
	if (!err)
		ch->tx_off = ch->tx_len = 0;
	return err;
}

int rail_ib_chan_recv(struct rail_ib_comm *c, struct rail_ib_msg *m)
{
	struct rail_ib_chan *ch = c->chan;
	char why[200];
	int err, type;

	if (ch->rx_body < 0) {
		err = rail_sock_recv_nb(c->oob_fd, ch->rx, RAIL_IB_HDR_SIZE, &ch->rx_off);
		ch->sock_err = err && err != -EAGAIN;
		if (err)
			return err;
		ch->rx_body = rail_ib_msg_header(ch->rx, &type, why, sizeof(why));
		if (ch->rx_body < 0)
			goto bad;
	}
	err = rail_sock_recv_nb(c->oob_fd, ch->rx, RAIL_IB_HDR_SIZE + (size_t)ch->rx_body,
				&ch->rx_off);
	ch->sock_err = err && err != -EAGAIN;
	if (err)
		return err;
	err = rail_ib_msg_decode(ch->rx, ch->rx_off, m, why, sizeof(why));
	ch->rx_off = 0;
	ch->rx_body = -1;
	if (!err)
		return 0;
bad:
	RAIL_WARN("connection to peer %s (%s comm on %s:%d): a message on the handshake socket is "
		  "bad: %s", c->peer, c->base.kind == RAIL_COMM_SEND ? "send" : "receive",
		  c->res[0].dev->hca->name, c->res[0].dev->port, why);
	return -EPROTO;
}

int rail_ib_chan_partial(const struct rail_ib_comm *c)
{
	return c->chan->rx_off != 0 || c->chan->rx_body >= 0;
}

int rail_ib_chan_sock_err(const struct rail_ib_comm *c)
{
	return c->chan && c->chan->sock_err;
}
