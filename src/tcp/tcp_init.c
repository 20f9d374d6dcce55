/*
 * nccl-net-rail: the TCP transport's ops table, its init and fini, device
 * properties, and memory registrations. The devices themselves: tcp_dev.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

static int tcp_init(char *why, size_t why_len)
{
	int n;

	tcp_comm_ops_set(&rail_tcp_ops);
	n = tcp_devs_init(why, why_len);
	if (n > 0)
		tcp_fault_arm();
	return n;
}

static void tcp_fini(void)
{
	tcp_rescue_stop();
	tcp_pool_stop();
	tcp_devs_fini();
}

static int tcp_get_props(int dev, struct rail_props *p)
{
	const struct tcp_dev *d = tcp_dev_get(dev);

	if (!d)
		return -EINVAL;
	p->name = d->name;
	p->pci_path = d->has_pci ? d->pci_path : NULL;
	p->guid = (uint64_t)dev;
	p->ptr_support = RAIL_PTR_HOST;
	p->reg_is_global = 1;
	p->force_flush = 0;
	p->speed = d->speed;
	p->port = 0;
	p->latency = 0;
	p->max_comms = 65536;
	p->max_recvs = RAIL_MAX_RECVS;
	p->vdev_ndevs = 1;
	p->vdev_devs[0] = dev;
	p->max_p2p_bytes = RAIL_MAX_MSG_BYTES;
	p->max_coll_bytes = RAIL_MAX_MSG_BYTES;
	p->max_multi_request_size = 1;
	return 0;
}

static void tcp_describe(char *buf, size_t len)
{
	size_t off = 0;
	int nt = (int)rail_param_int(RAIL_P_SOCKET_NTHREADS);
	int ns = (int)rail_param_int(RAIL_P_NSOCKS_PERTHREAD);
	char why[128], iwhy[128];
	int pool = tcp_pool_size(why, sizeof(why));
	uint32_t inl = tcp_inline_max(iwhy, sizeof(iwhy));

	off += (size_t)snprintf(buf, len, "interfaces (%s):", tcp_devs_rule());
	for (int i = 0; i < tcp_ndevs_now() && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, " [%d]%s:%s %d Gbps", i,
					tcp_dev_get(i)->name, RAIL_ADDRSTR(&tcp_dev_get(i)->addr),
					tcp_dev_get(i)->speed / 1000);
	if (off < len)
		snprintf(buf + off, len - off, "; %d data sockets per connection, moved by at most "
			 "%d helper threads per process (%s), shared by all connections; messages "
			 "up to %u KiB on the control socket (%s)",
			 RAIL_MIN((nt > 0 ? nt : TCP_DEFAULT_THREADS) *
				  (ns > 0 ? ns : TCP_DEFAULT_SOCKS_PER_THREAD), TCP_MAX_SOCKS),
			 pool, why, inl >> 10, iwhy);
}

/*
 * Host memory needs no registration with sockets. Each regMr hands out a
 * new id (never a pointer) that its comm records until deregMr, so a second
 * deregMr, or one on another comm, fails instead of passing silently.
 */
static _Atomic uintptr_t tcp_mr_next = 1;

int tcp_reg_mr(struct rail_comm *comm, void *data, size_t size, int type, void **mh)
{
	struct tcp_comm *c = (struct tcp_comm *)comm;
	uintptr_t id;

	if (type != RAIL_PTR_HOST) {
		RAIL_WARN("regMr(%p, %zu bytes) on %s: the TCP transport only handles host "
			  "memory (type 0x%x)", data, size, tcp_comm_dev_name(c), type);
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mr_lock);
	if (c->nmrs == c->cap_mrs) {
		int ncap = c->cap_mrs ? c->cap_mrs * 2 : 8;
		uintptr_t *n = realloc(c->mrs, (size_t)ncap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&c->mr_lock);
			RAIL_WARN("regMr(%p, %zu bytes) on %s: out of memory", data, size,
				  tcp_comm_dev_name(c));
			return -ENOMEM;
		}
		c->mrs = n;
		c->cap_mrs = ncap;
	}
	/* Ids stay clear of small integers and of NULL. */
	id = atomic_fetch_add(&tcp_mr_next, 1) << 4;
	c->mrs[c->nmrs++] = id;
	pthread_mutex_unlock(&c->mr_lock);
	*mh = (void *)id;
	return 0;
}

int tcp_dereg_mr(struct rail_comm *comm, void *mh)
{
	struct tcp_comm *c = (struct tcp_comm *)comm;
	int found = 0;

	pthread_mutex_lock(&c->mr_lock);
	for (int i = 0; i < c->nmrs && !found; i++) {
		if (c->mrs[i] == (uintptr_t)mh) {
			c->mrs[i] = c->mrs[--c->nmrs];
			found = 1;
		}
	}
	pthread_mutex_unlock(&c->mr_lock);
	if (!found) {
		RAIL_WARN("deregMr(%p) on the %s comm on %s, peer %s: not a live registration of "
			  "this comm (deregistered twice, or registered on another comm?)", mh,
			  c->is_send ? "send" : "receive", tcp_comm_dev_name(c), c->peer);
		return -EINVAL;
	}
	return 0;
}

/* Sockets write host memory directly: nothing ever needs flushing. */
static int tcp_iflush(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		      const int *sizes, void **mhandles)
{
	(void)comm, (void)req, (void)n, (void)data, (void)sizes, (void)mhandles;
	return 1;
}

const struct rail_transport_ops rail_tcp_ops = {
	.name = "tcp",
	.req_size = sizeof(struct tcp_req),
	.init = tcp_init,
	.fini = tcp_fini,
	.ndevs = tcp_ndevs_now,
	.get_props = tcp_get_props,
	.describe = tcp_describe,
	.listen = tcp_listen,
	.connect = tcp_connect,
	.accept = tcp_accept,
	.reg_mr = tcp_reg_mr,
	.reg_mr_dmabuf = NULL,
	.dereg_mr = tcp_dereg_mr,
	.isend = tcp_isend,
	.irecv = tcp_irecv,
	.iflush = tcp_iflush,
	.test = tcp_test,
	.close_send = tcp_close,
	.close_recv = tcp_close,
	.close_listen = tcp_close_listen,
	.describe_comm = tcp_describe_comm,
	.make_vdevice = NULL,
};
