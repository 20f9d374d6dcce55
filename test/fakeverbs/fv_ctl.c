/*
 * fakeverbs: what a test changes while the plugin runs, through calls it
 * looks up with dlsym (exported at version FAKEVERBS_TEST): queue an async
 * event on every open context of a device, change a GID table entry (the
 * table ibv_query_gid and the RTR check read, and its sysfs files), and
 * take a port down or up (ibv_query_port's state, with PORT_ERR or
 * PORT_ACTIVE, as the kernel does; the data path holds the send WRs of
 * QPs on a port that is not ACTIVE, fv_hold.c), hold every send WR of a
 * device (fv_test_hold: data in flight), and make the next QP state
 * changes of a device fail (fv_test_modify_fail), change a port's speed
 * (fv_test_port_speed, with or without DEVICE_SPEED_CHANGE). A GID change
 * raises no event by itself: the test says when the kernel's GID_CHANGE
 * arrives.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "fv.h"

/* Under fv_lock: the device called name, and its port (1-based) if it has it. */
static struct fv_port *find_port(const char *name, int port, struct fv_dev **dev)
{
	for (int i = 0; i < fv_conf.ndevs; i++) {
		struct fv_dev *d = &fv_conf.devs[i];

		if (strcmp(d->ibdev.name, name))
			continue;
		if (port < 1 || port > d->nports)
			return NULL;
		*dev = d;
		return &d->ports[port - 1];
	}
	return NULL;
}

/* Under fv_lock. Returns the number of contexts the event was queued on. */
static int queue_event(const struct fv_dev *d, int port, int type)
{
	int n = 0;

	for (struct fv_ctx *c = fv_ctxs; c; c = c->next) {
		struct ibv_async_event *ev;

		if (c->dev != d || c->evq_n == FV_EVQ)
			continue;
		ev = &c->evq[(c->evq_head + c->evq_n++) % FV_EVQ];
		memset(ev, 0, sizeof(*ev));
		ev->event_type = (enum ibv_event_type)type;
		ev->element.port_num = port;
		if (write(c->async_pipe[1], "e", 1) != 1)
			c->evq_n--;
		else
			n++;
	}
	fv_log("inject_event dev=%s port=%d event=%d contexts=%d", d->ibdev.name, port, type, n);
	return n;
}

/* A port event (PORT_ERR, PORT_ACTIVE, GID_CHANGE, LID_CHANGE, ...) on dev:port. */
int fv_test_event(const char *dev, int port, int event_type)
{
	struct fv_dev *d = NULL;
	int n = -ENODEV;

	pthread_mutex_lock(&fv_lock);
	if (find_port(dev, port, &d))
		n = queue_event(d, port, event_type);
	if (d && event_type == IBV_EVENT_DEVICE_FATAL)
		d->dead = 1;	/* for good: a real HCA needs a reset (fv_hold.c) */
	pthread_mutex_unlock(&fv_lock);
	return n;
}

int fv_test_qp_fatal(const char *dev)
{
	int n = -ENODEV;

	pthread_mutex_lock(&fv_lock);
	for (struct fv_qp *q = fv_qp_list(); q; q = q->next) {
		if (strcmp(q->dev->ibdev.name, dev) || q->state != IBV_QPS_RTS ||
		    q->dest_qpn == q->qp.qp_num)
			continue;
		fv_qp_error(q);
		for (struct fv_ctx *c = fv_ctxs; c; c = c->next) {
			struct ibv_async_event *ev;

			if (&c->vctx.context != q->qp.context || c->evq_n == FV_EVQ)
				continue;
			ev = &c->evq[(c->evq_head + c->evq_n++) % FV_EVQ];
			memset(ev, 0, sizeof(*ev));
			ev->event_type = IBV_EVENT_QP_FATAL;
			ev->element.qp = &q->qp;
			if (write(c->async_pipe[1], "e", 1) != 1)
				c->evq_n--;
		}
		n = (int)q->qp.qp_num;
		fv_log("test_qp_fatal dev=%s qpn=0x%x sq_psn=%u rq_psn=%u", dev, q->qp.qp_num,
		       q->sq_psn, q->rq_psn);
		break;
	}
	pthread_mutex_unlock(&fv_lock);
	return n;
}

/*
 * Set GID index of dev:port to addr (type 0 IB, 1 RoCE v1, 2 RoCE v2); addr
 * NULL empties it. The index must be inside the port's gid_tbl_len.
 */
int fv_test_set_gid(const char *dev, int port, int index, const char *addr, int type)
{
	struct fv_dev *d = NULL;
	struct fv_port *p;
	union ibv_gid g;
	char text[64];

	if (index < 0 || index >= FV_MAX_GIDS || type < 0 || type > 2 ||
	    (addr && inet_pton(AF_INET6, addr, g.raw) != 1))
		return -EINVAL;
	pthread_mutex_lock(&fv_lock);
	p = find_port(dev, port, &d);
	if (!p || index >= p->gid_tbl_len) {	/* a real table never grows */
		pthread_mutex_unlock(&fv_lock);
		return p ? -ERANGE : -ENODEV;
	}
	if (addr) {
		p->gids[index].gid = g;
		p->gids[index].type = type;
	} else {
		memset(&p->gids[index].gid, 0, sizeof(g));
	}
	p->gids[index].valid = addr != NULL;
	fv_sysfs_gid(d, port, index);
	fv_log("set_gid dev=%s port=%d index=%d gid=%s type=%d", dev, port, index,
	       addr ? fv_gid_str(&g, text, sizeof(text)) : "none", type);
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

/* The port goes to state (enum ibv_port_state): PORT_ACTIVE if active, else PORT_ERR. */
int fv_test_port_state(const char *dev, int port, int state)
{
	struct fv_dev *d = NULL;
	struct fv_port *p;
	int n;

	pthread_mutex_lock(&fv_lock);
	p = find_port(dev, port, &d);
	if (!p) {
		pthread_mutex_unlock(&fv_lock);
		return -ENODEV;
	}
	p->state = state;
	fv_sysfs_port(d, port);
	n = queue_event(d, port, state == IBV_PORT_ACTIVE ? IBV_EVENT_PORT_ACTIVE
							 : IBV_EVENT_PORT_ERR);
	pthread_mutex_unlock(&fv_lock);
	return n;
}

int fv_test_port_speed(const char *dev, int port, unsigned speed, int width, long port_speed,
		       int event)
{
	struct fv_dev *d = NULL;
	struct fv_port *p;
	int n = 0;

	pthread_mutex_lock(&fv_lock);
	p = find_port(dev, port, &d);
	if (!p) {
		pthread_mutex_unlock(&fv_lock);
		return -ENODEV;
	}
	if (speed)
		p->speed = speed;
	if (width)
		p->width = width;
	p->port_speed = port_speed < -2 ? -1 : port_speed;
	fv_sysfs_port(d, port);
	fv_log("set_speed dev=%s port=%d speed=0x%x width=%d port_speed=%ld event=%d", dev, port,
	       p->speed, p->width, p->port_speed, event);
	if (event)	/* mlx5 raises it for the device: element.port_num 0 */
		n = queue_event(d, 0, FV_EVENT_DEVICE_SPEED_CHANGE);
	pthread_mutex_unlock(&fv_lock);
	return n;
}

/*
 * While on, every send WR posted on dev's QPs is held (fv_hold.c), never
 * timed out; off: they are carried out in order at the next entry into the
 * provider (ports permitting), their retry timers restarted. The number of
 * WRs held on the device's QPs now, or -ENODEV.
 */
int fv_test_hold(const char *dev, int on)
{
	int n = -ENODEV;

	pthread_mutex_lock(&fv_lock);
	for (int i = 0; i < fv_conf.ndevs; i++) {
		struct fv_dev *d = &fv_conf.devs[i];

		if (strcmp(d->ibdev.name, dev))
			continue;
		d->hold = on != 0;
		n = fv_hold_count(d, !on);
		fv_log("test_hold dev=%s on=%d held=%d", dev, d->hold, n);
		break;
	}
	pthread_mutex_unlock(&fv_lock);
	return n;
}

int fv_test_modify_fail(const char *dev, int state, int err, int count)
{
	int n = -ENODEV;

	pthread_mutex_lock(&fv_lock);
	for (int i = 0; i < fv_conf.ndevs; i++) {
		struct fv_dev *d = &fv_conf.devs[i];

		if (strcmp(d->ibdev.name, dev))
			continue;
		d->fail_state = state;
		d->fail_err = err;
		d->fail_left = count > 0 ? count : 0;
		fv_log("test_modify_fail dev=%s state=%d err=%d count=%d", dev, state, err, count);
		n = 0;
		break;
	}
	pthread_mutex_unlock(&fv_lock);
	return n;
}
