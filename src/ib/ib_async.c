/*
 * nccl-net-rail: one async-event thread per HCA. Fatal events mark what
 * they hit: DEVICE_FATAL the HCA (every comm on it), CQ_ERR and the QP
 * errors the comm owning the CQ/QP (cq_context/qp_context). Later calls on
 * those comms return an error. PORT_ERR marks the port (new connections
 * on it are refused; running comms fail through their completions).
 * The thread waits in poll() on the async fd and a wake pipe, so fini
 * stops it at once.
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"

static struct rail_ib_dev *port_dev(struct rail_ib_hca *hca, int port)
{
	for (int i = 0; i < rail_ib_ndevs_phys(); i++) {
		struct rail_ib_dev *d = rail_ib_dev_get(i);

		if (d->hca == hca && d->port == port)
			return d;
	}
	return NULL;
}

static void on_qp_event(struct rail_ib_hca *hca, struct ibv_async_event *ev)
{
	struct ibv_qp *qp = ev->element.qp;
	struct rail_ib_comm *c = qp->qp_context;

	if (ev->event_type != IBV_EVENT_QP_FATAL && ev->event_type != IBV_EVENT_QP_REQ_ERR &&
	    ev->event_type != IBV_EVENT_QP_ACCESS_ERR) {
		RAIL_INFO(RAIL_LOG_NET, "%s: async event %s on qp 0x%x", hca->name,
			  rail_ibv_event_str(ev->event_type), qp->qp_num);
		return;
	}
	if (c)
		atomic_store(&c->fatal, (int)ev->event_type + 1);
	RAIL_WARN("%s: async event %s on qp 0x%x (connection to peer %s): the communicator fails "
		  "from now on; %s", hca->name, rail_ibv_event_str(ev->event_type), qp->qp_num,
		  c ? c->peer : "?", ev->event_type == IBV_EVENT_QP_ACCESS_ERR
		  ? "a remote access was refused (bad rkey or buffer freed while registered?)"
		  : "check the link and the peer process");
}

static void handle_event(struct rail_ib_hca *hca, struct ibv_async_event *ev)
{
	struct rail_ib_dev *d;

	switch (ev->event_type) {
	case IBV_EVENT_DEVICE_FATAL:
		atomic_store(&hca->fatal, 1);
		RAIL_WARN("%s: async event %s: the device failed; every communicator on it fails "
			  "from now on (check dmesg and the adapter firmware)", hca->name,
			  rail_ibv_event_str(ev->event_type));
		break;
	case IBV_EVENT_CQ_ERR: {
		struct rail_ib_comm *c = ev->element.cq->cq_context;

		if (c)
			atomic_store(&c->fatal, (int)ev->event_type + 1);
		RAIL_WARN("%s: async event %s (completion queue overrun?) on a connection to peer "
			  "%s: the communicator fails from now on", hca->name,
			  rail_ibv_event_str(ev->event_type), c ? c->peer : "?");
		break;
	}
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		on_qp_event(hca, ev);
		break;
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_PORT_ACTIVE:
		d = port_dev(hca, ev->element.port_num);
		if (d)
			atomic_store(&d->port_err, ev->event_type == IBV_EVENT_PORT_ERR);
		if (ev->event_type == IBV_EVENT_PORT_ERR)
			RAIL_WARN("%s:%d: async event %s: the port went down; connections through it "
				  "fail until it is ACTIVE again", hca->name, ev->element.port_num,
				  rail_ibv_event_str(ev->event_type));
		else
			RAIL_INFO(RAIL_LOG_NET, "%s:%d: port ACTIVE again", hca->name,
				  ev->element.port_num);
		break;
	default:
		RAIL_INFO(RAIL_LOG_NET, "%s: async event %s", hca->name,
			  rail_ibv_event_str(ev->event_type));
		break;
	}
}

static void *async_main(void *arg)
{
	struct rail_ib_hca *hca = arg;
	struct pollfd fds[2] = {
		{ .fd = hca->ctx->async_fd, .events = POLLIN },
		{ .fd = hca->async_wake[0], .events = POLLIN },
	};

	for (;;) {
		struct ibv_async_event ev;

		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			RAIL_WARN("%s: async event thread: poll failed: %s; stopping it", hca->name,
				  RAIL_ERRSTR(-errno));
			break;
		}
		if (fds[1].revents)
			break;
		if (!(fds[0].revents & POLLIN))
			continue;
		if (rail_ibv.get_async_event(hca->ctx, &ev))
			continue;	/* EAGAIN: the fd is non-blocking */
		handle_event(hca, &ev);
		rail_ibv.ack_async_event(&ev);
	}
	return NULL;
}

int rail_ib_async_start(struct rail_ib_hca *hca)
{
	int flags = fcntl(hca->ctx->async_fd, F_GETFL);
	int err;

	if (flags < 0 || fcntl(hca->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	if (pipe2(hca->async_wake, O_CLOEXEC))
		return -errno;
	err = pthread_create(&hca->async_thread, NULL, async_main, hca);
	if (err) {
		close(hca->async_wake[0]);
		close(hca->async_wake[1]);
		hca->async_wake[0] = hca->async_wake[1] = -1;
		return -err;
	}
	hca->async_started = 1;
	return 0;
}

void rail_ib_async_stop(struct rail_ib_hca *hca)
{
	if (hca->async_started) {
		ssize_t n;

		do {
			n = write(hca->async_wake[1], "x", 1);
		} while (n < 0 && errno == EINTR);
		pthread_join(hca->async_thread, NULL);
		hca->async_started = 0;
	}
	for (int i = 0; i < 2; i++) {
		if (hca->async_wake[i] >= 0)
			close(hca->async_wake[i]);
		hca->async_wake[i] = -1;
	}
}
