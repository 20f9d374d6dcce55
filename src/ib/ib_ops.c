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
#include <stdio.h>
#include <string.h>

#include "ib/ib.h"
#include "ib/ib_job.h"
#include "log.h"
#include "param.h"

extern char **environ;

/*
 * NCCL 2.30's IB resiliency (NCCL_IB_RESILIENCY_*, off by default in NCCL,
 * failing over only among the members of a fused vNIC) is NCCL's internal
 * transport's: it does not run under this plugin, whose own failover
 * applies. One INFO line names the variables set and how they map.
 */
static void resiliency_note(void)
{
	char set[512];
	size_t off = 0;

	set[0] = '\0';
	for (char **e = environ; e && *e && off < sizeof(set); e++) {
		int w;

		if (strncmp(*e, "NCCL_IB_RESILIENCY_", 19))
			continue;
		w = snprintf(set + off, sizeof(set) - off, "%s%.100s", off ? ", " : "", *e);
		off += w > 0 ? (size_t)w : 0;
	}
	if (!set[0])
		return;
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_ENV, "%s: NCCL's IB resiliency is not used with this "
		  "plugin; its own failover applies instead (NCCL_RAIL_FAILOVER=%lld): a connection "
		  "moves to another NIC port, not only to another member of a fused vNIC, within "
		  "milliseconds of the fault. PORT_FAILOVER maps to NCCL_RAIL_FAILOVER, "
		  "PORT_FAILOVER_MAX_ATTEMPTS to the fixed bound of 4 moves per connection in 60 s, "
		  "PORT_FAILOVER_PROBE_DELAY to nothing (the receiver's own record decides what is "
		  "sent again), PORT_RECOVERY_* to the move back after NCCL_RAIL_FAILOVER_HOLDDOWN "
		  "(%lld s) (docs/FAILOVER.md)", set, (long long)rail_param_int(RAIL_P_FAILOVER),
		  (long long)rail_param_int(RAIL_P_FAILOVER_HOLDDOWN));
}

static int ib_init(char *why, size_t why_len)
{
	int n;

	rail_ib_conn_ops_set(&rail_ib_ops);
	resiliency_note();
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
	rail_ib_job_fini();	/* the handshakes' helper threads */
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
