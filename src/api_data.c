/*
 * nccl-net-rail: the data calls of the version-neutral API (isend, irecv,
 * iflush, test): requests from the comm's pool as handles, the flight
 * record and counters of each, and the turn-taking with a transport's own
 * thread (api_int.h). errno -> ncclResult_t here too (rail_result).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "api.h"
#include "api_int.h"
#include "handles.h"
#include "log.h"
#include "rail.h"
#include "stats.h"

static struct rail_req *req_get(struct rail_comm *c, int type, int n, const char *call,
			       uintptr_t *h, uint32_t *slot)
{
	uint32_t i;
	struct rail_req *r = rail_pool_get_idx(&c->reqs, &i);

	if (rail_unlikely(!r)) {
		RAIL_WARN("%s: all %u requests of this comm (device %d) are in flight; NCCL "
			  "allows %d per comm (x%d on the send side)", call, c->reqs.capacity,
			  c->dev, RAIL_MAX_REQUESTS, RAIL_MAX_RECVS);
		return NULL;
	}
	r->magic = RAIL_REQ_MAGIC;
	r->type = type;
	r->n = n;
	r->comm = c;
	r->stamp = ++c->stamp & RAIL_H_STAMP_MASK;
	*h = rail_h_req_encode(c->hidx, i, r->stamp);
	*slot = i;
	r->slot = i;
	return r;
}

static void req_put(struct rail_req *r)
{
	if (rail_unlikely(r->prof != NULL))
		rail_prof_finish(r->prof);
	r->magic = 0;
	rail_pool_put(&r->comm->reqs, r);
}

static const char *req_name(int type)
{
	return type == RAIL_REQ_SEND ? "send" : type == RAIL_REQ_RECV ? "receive" : "flush";
}

/*
 * A call on comm c failed with err (not -EAGAIN): count it, note it in the
 * flight record and, the first time, log the record (r: the request whose
 * post or test failed, still held, or NULL).
 */
static void comm_failed(struct rail_comm *c, const struct rail_req *r, uint32_t slot,
			const char *call, int err)
{
	char why[256];

	c->st.errors++;
	rail_flight_add(&c->fl, 0, RAIL_FEV_ERROR, (uint16_t)slot, r ? r->size : 0,
			r ? r->tag : 0, err);
	if (c->fl.logged)
		return;
	if (r)
		snprintf(why, sizeof(why), "%s of %s req=%u (size %llu, tag %d) failed: %s", call,
			 req_name(r->type), (unsigned)slot, (unsigned long long)r->size, (int)r->tag,
			 RAIL_ERRSTR(err));
	else
		snprintf(why, sizeof(why), "%s failed: %s", call, RAIL_ERRSTR(err));
	rail_flight_dump(c, why);
}

/*
 * Post-to-completion latency (the stats histogram, the flight record's
 * "after") is measured on one request in RAIL_LAT_EVERY per comm: a precise
 * clock read costs about 20 ns on a host but 0.4 us under emulation (the
 * Soft-RoCE guest), and two per request showed in its 8-byte latency.
 * Everything else is stamped with the coarse clock.
 */
#define RAIL_LAT_EVERY 8u

/* A post was accepted: note when and what. */
static inline void req_posted(struct rail_comm *c, struct rail_req *r, uint32_t slot,
			      uint8_t ev, uint64_t size, int tag, int n)
{
	uint64_t now = rail_flight_now(&c->fl);

	r->t_post = now;
	r->t_lat = c->lat_tick++ % RAIL_LAT_EVERY == 0 ? rail_now_ns() : 0;
	r->size = size;
	r->tag = tag;
	rail_flight_add(&c->fl, now, ev, (uint16_t)slot, size, tag, n);
}

/*
 * The profiler parents of a request (prof.h): attached only when NCCL gave
 * both a callback and parent handles; the comm's table is made on first use.
 */
static void req_prof(struct rail_comm *c, struct rail_req *r, uint32_t slot, int n,
		     void *const *parents)
{
	int any = 0;

	for (int i = 0; i < n; i++)
		any |= parents[i] != NULL;
	if (!any || !rail_prof_on())
		return;
	if (!c->prof) {
		c->prof = calloc(c->reqs.capacity, sizeof(*c->prof));
		if (!c->prof)
			return;	/* no events for this request */
	}
	r->prof = &c->prof[slot];
	rail_prof_attach(r->prof, n, parents);
}

ncclResult_t rail_net_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
			    void **request)
{
	return rail_net_isend_ph(send_comm, data, size, tag, mhandle, NULL, request);
}

static ncclResult_t isend_body(struct rail_comm *c, void *data, size_t size, int tag, void *mh,
			       void *phandle, void **request);

ncclResult_t rail_net_isend_ph(void *send_comm, void *data, size_t size, int tag, void *mhandle,
			       void *phandle, void **request)
{
	struct rail_comm *c = comm_of(send_comm, RAIL_COMM_SEND, "isend");
	ncclResult_t res;
	void *mh;

	if (!c || !request || mr_of(mhandle, "isend", &mh))
		return ncclInternalError;
	if (!comm_enter(c)) {
		*request = NULL;	/* the transport's thread has the comm: retry */
		return ncclSuccess;
	}
	res = isend_body(c, data, size, tag, mh, phandle, request);
	comm_leave(c);
	return res;
}

static ncclResult_t isend_body(struct rail_comm *c, void *data, size_t size, int tag, void *mh,
			       void *phandle, void **request)
{
	struct rail_req *r;
	uintptr_t h;
	uint32_t slot;
	int err;

	rail_flight_call(&c->fl);
	r = req_get(c, RAIL_REQ_SEND, 1, "isend", &h, &slot);
	if (!r)
		return ncclInternalError;
	r->size = size;	/* for a flight record logged while it is posted */
	r->tag = tag;
	if (rail_unlikely(phandle != NULL))
		req_prof(c, r, slot, 1, &phandle);
	err = c->ops->isend(c, r, data, size, tag, mh);
	if (err) {
		if (err == -EAGAIN) {
			req_put(r);
			c->st.refused++;
			rail_flight_add(&c->fl, 0, RAIL_FEV_REFUSED, 0, size, tag, 1);
			*request = NULL;
			return ncclSuccess;
		}
		comm_failed(c, r, slot, "isend", err);
		req_put(r);
		return rail_result(err);
	}
	req_posted(c, r, slot, RAIL_FEV_SEND, size, tag, 1);
	*request = (void *)h;
	return ncclSuccess;
}

ncclResult_t rail_net_irecv(void *recv_comm, int n, void **data, size_t *sizes,
			    int *tags, void **mhandles, void **request)
{
	return rail_net_irecv_ph(recv_comm, n, data, sizes, tags, mhandles, NULL, request);
}

static ncclResult_t irecv_body(struct rail_comm *c, int n, void **data, size_t *sizes, int *tags,
			       void **mhandles, void **mhs, void **phandles, void **request);

ncclResult_t rail_net_irecv_ph(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
			       void **mhandles, void **phandles, void **request)
{
	struct rail_comm *c = comm_of(recv_comm, RAIL_COMM_RECV, "irecv");
	void *mhs[RAIL_MAX_RECVS];
	ncclResult_t res;

	if (!c || !request || !data || !sizes)
		return ncclInternalError;
	if (n < 1 || n > RAIL_MAX_RECVS) {
		RAIL_WARN("irecv: %d grouped receives, the plugin advertises at most %d", n,
			  RAIL_MAX_RECVS);
		return ncclInternalError;
	}
	if (mhandles && mrs_of(n, mhandles, mhs, "irecv"))
		return ncclInternalError;
	if (!comm_enter(c)) {
		*request = NULL;	/* the transport's thread has the comm: retry */
		return ncclSuccess;
	}
	res = irecv_body(c, n, data, sizes, tags, mhandles, mhs, phandles, request);
	comm_leave(c);
	return res;
}

static ncclResult_t irecv_body(struct rail_comm *c, int n, void **data, size_t *sizes, int *tags,
			       void **mhandles, void **mhs, void **phandles, void **request)
{
	struct rail_req *r;
	uintptr_t h;
	uint32_t slot;
	int err;

	rail_flight_call(&c->fl);
	r = req_get(c, RAIL_REQ_RECV, n, "irecv", &h, &slot);
	if (!r)
		return ncclInternalError;
	r->size = sizes[0];
	r->tag = tags ? tags[0] : 0;
	if (rail_unlikely(phandles != NULL))
		req_prof(c, r, slot, n, phandles);
	err = c->ops->irecv(c, r, n, data, sizes, tags, mhandles ? mhs : NULL);
	if (err) {
		if (err == -EAGAIN) {
			req_put(r);
			c->st.refused++;
			rail_flight_add(&c->fl, 0, RAIL_FEV_REFUSED, 0, sizes[0], tags ? tags[0] : 0, 1);
			*request = NULL;
			return ncclSuccess;
		}
		comm_failed(c, r, slot, "irecv", err);
		req_put(r);
		return rail_result(err);
	}
	req_posted(c, r, slot, RAIL_FEV_RECV, sizes[0], tags ? tags[0] : 0, n);
	*request = (void *)h;
	return ncclSuccess;
}

static ncclResult_t iflush_body(struct rail_comm *c, int n, void **data, int *sizes,
				void **mhandles, void **mhs, void **request);

ncclResult_t rail_net_iflush(void *recv_comm, int n, void **data, int *sizes,
			     void **mhandles, void **request)
{
	struct rail_comm *c = comm_of(recv_comm, RAIL_COMM_RECV, "iflush");
	void *mhs[RAIL_MAX_RECVS];
	ncclResult_t res;

	if (!c || !request)
		return ncclInternalError;
	if (n < 1 || n > RAIL_MAX_RECVS)
		return ncclInternalError;
	if (mhandles && mrs_of(n, mhandles, mhs, "iflush"))
		return ncclInternalError;
	/* a NULL request would mean "nothing to flush": wait for the transport's thread */
	while (!comm_enter(c))
		sched_yield();
	res = iflush_body(c, n, data, sizes, mhandles, mhs, request);
	comm_leave(c);
	return res;
}

static ncclResult_t iflush_body(struct rail_comm *c, int n, void **data, int *sizes,
				void **mhandles, void **mhs, void **request)
{
	struct rail_req *r;
	uintptr_t h;
	uint32_t slot;
	int err;

	rail_flight_call(&c->fl);
	r = req_get(c, RAIL_REQ_FLUSH, n, "iflush", &h, &slot);
	if (!r)
		return ncclInternalError;
	err = c->ops->iflush(c, r, n, data, sizes, mhandles ? mhs : NULL);
	if (err) {
		/* 1: nothing to flush. NCCL counts a NULL request as done. */
		req_put(r);
		*request = NULL;
		if (err == 1)
			return ncclSuccess;
		comm_failed(c, NULL, slot, "iflush", err);
		return rail_result(err);
	}
	req_posted(c, r, slot, RAIL_FEV_FLUSH, sizes ? (uint64_t)sizes[0] : 0, 0, n);
	*request = (void *)h;
	return ncclSuccess;
}

/* The request of a handle, if it is in flight; reads only live memory. */
static struct rail_req *req_of(void *request)
{
	uint32_t ci, ri, stamp, kind = 0;
	struct rail_comm *c;
	struct rail_req *r;

	if (!rail_h_req_decode((uintptr_t)request, &ci, &ri, &stamp))
		return NULL;
	c = rail_h_get_idx(RAIL_HT_COMM, ci, &kind);
	if (!c || (kind != RAIL_COMM_SEND && kind != RAIL_COMM_RECV))
		return NULL;
	r = rail_pool_at(&c->reqs, ri);
	if (!r || r->magic != RAIL_REQ_MAGIC || r->stamp != stamp)
		return NULL;
	return r;
}

/* Count a completed request and note it in the flight record. */
static inline void req_done(struct rail_req *r, const size_t *got)
{
	struct rail_comm *c = r->comm;
	uint64_t now = rail_flight_now(&c->fl), bytes = 0;
	int32_t lat_us = -1;

	if (r->type == RAIL_REQ_SEND) {
		c->st.tx_msgs++;
		c->st.tx_bytes += bytes = got[0];
	} else if (r->type == RAIL_REQ_RECV) {
		for (int i = 0; i < r->n; i++)
			bytes += got[i];
		c->st.rx_msgs += (uint64_t)r->n;
		c->st.rx_bytes += bytes;
	} else {
		c->st.flushes++;
	}
	if (r->t_lat) {
		uint64_t lat = rail_now_ns() - r->t_lat;

		rail_stats_latency(&c->st, lat);
		lat_us = lat / 1000 > INT32_MAX ? INT32_MAX : (int32_t)(lat / 1000);
	}
	rail_flight_add(&c->fl, now, RAIL_FEV_DONE, (uint16_t)r->slot, bytes, r->tag, lat_us);
}

static ncclResult_t test_body(struct rail_req *r, int *done, int *sizes)
{
	size_t got[RAIL_MAX_RECVS] = { 0 };
	int d = 0, err;

	rail_flight_call(&r->comm->fl);
	err = r->comm->ops->test(r, &d, got);
	if (err) {
		comm_failed(r->comm, r, r->slot, "test", err);
		req_put(r);
		return rail_result(err);
	}
	*done = d;
	if (!d)
		return ncclSuccess;
	if (sizes && r->type != RAIL_REQ_FLUSH) {
		for (int i = 0; i < r->n; i++)
			sizes[i] = (int)got[i];
	}
	req_done(r, got);
	req_put(r);
	return ncclSuccess;
}

ncclResult_t rail_net_test(void *request, int *done, int *sizes)
{
	struct rail_req *r = req_of(request);
	struct rail_comm *c;
	ncclResult_t res;

	if (rail_unlikely(!r || !done)) {
		RAIL_WARN("test: %p is not a request in flight (tested again after it completed "
			  "or failed, or its comm was closed)", request);
		return ncclInternalError;
	}
	c = r->comm;
	if (!comm_enter(c)) {
		*done = 0;	/* the transport's thread has the comm: not done yet */
		return ncclSuccess;
	}
	res = test_body(r, done, sizes);	/* r may be back in the pool: c stays */
	comm_leave(c);
	return res;
}
