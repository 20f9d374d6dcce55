/*
 * nccl-net-rail: the verbs transport's ops table (what src/transport.c
 * sees), the top of src/ib/'s layers (ib.h).
 *
 * Besides the table: init and fini, which put the layers together -- the
 * devices (ib_init.c), then per HCA its async-event thread (ib_async.c);
 * at fini, per HCA the async thread and the registration cache (ib_mr.c)
 * before the devices close. And test, the one data-path op that both sides
 * share: the engine's CQ poll (ib_engine.c), then the progress of the side
 * the request is on (ib_send.c, ib_recv.c).
 */
#include "ib/ib.h"
#include "log.h"

static int ib_init(char *why, size_t why_len)
{
	int n;

	rail_ib_conn_ops_set(&rail_ib_ops);
	n = rail_ib_devices_init(why, why_len);
	for (int i = 0; i < rail_ib_hca_count(); i++) {
		struct rail_ib_hca *hca = rail_ib_hca_get(i);

		if (rail_ib_async_start(hca))
			RAIL_WARN("%s: no async event thread; fatal device errors will only show as "
				  "failed completions", hca->name);
	}
	return n;
}

static void ib_fini(void)
{
	rail_ib_move_fini();
	for (int i = 0; i < rail_ib_hca_count(); i++) {
		struct rail_ib_hca *hca = rail_ib_hca_get(i);

		rail_ib_async_stop(hca);
		rail_ib_mr_cache_fini(hca);
	}
	rail_ib_devices_fini();
}

/* Progress besides the CQ: the receiver's ring and want word; the sender's CTSes. */
static int progress(struct rail_ib_comm *c)
{
	if (c->base.kind == RAIL_COMM_RECV)
		return rail_ib_recv_progress(c);
	return rail_ib_send_progress(c);
}

int rail_ib_test(struct rail_req *req, int *done, size_t *sizes)
{
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	struct rail_ib_comm *c = (struct rail_ib_comm *)req->comm;
	int err;

	if (!r->done && !r->error) {
		/* A receive only the ring can complete: one load, mostly. */
		err = c->base.kind == RAIL_COMM_RECV && !c->mv ? rail_ib_recv_fast(c, r) : 0;
		if (err == 0) {
			err = rail_ib_comm_check(c, "test");
			if (!err)
				err = rail_ib_poll(c);
			if (!err && !r->done)
				err = progress(c);
			if (err == -EAGAIN)
				err = 0;	/* the comm is moving to another path: not done yet */
		} else if (err > 0) {
			err = 0;
		}
		if (err && !r->done)
			return err;
	}
	if (!r->done && !r->error)
		rail_ib_peer_check(c, "test");
	if (r->error || (!r->done && c->error))
		return r->error ? r->error : c->error;
	*done = r->done;
	if (r->done && req->type != RAIL_REQ_FLUSH) {
		for (int i = 0; i < req->n; i++)
			sizes[i] = r->sizes[i];
	}
	return 0;
}

const struct rail_transport_ops rail_ib_ops = {
	.name = "ib",
	.req_size = sizeof(struct rail_ib_req),
	.init = ib_init,
	.fini = ib_fini,
	.ndevs = rail_ib_ndevs,
	.get_props = rail_ib_get_props,
	.describe = rail_ib_describe,
	.listen = rail_ib_listen,
	.connect = rail_ib_connect,
	.accept = rail_ib_accept,
	.reg_mr = rail_ib_reg_mr,
	.reg_mr_dmabuf = rail_ib_reg_mr_dmabuf,
	.dereg_mr = rail_ib_dereg_mr,
	.isend = rail_ib_isend,
	.irecv = rail_ib_irecv,
	.iflush = rail_ib_iflush,
	.test = rail_ib_test,
	.close_send = rail_ib_close_send,
	.describe_comm = rail_ib_describe_comm,
	.close_recv = rail_ib_close_recv,
	.close_listen = rail_ib_close_listen,
	.make_vdevice = rail_ib_make_vdevice,
};
