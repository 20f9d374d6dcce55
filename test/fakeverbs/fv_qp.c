/*
 * fakeverbs: QP state changes, recorded attribute by attribute and checked
 * the way a ConnectX port would refuse them (RoCE without a GRH, an IB port
 * flagged GRH_REQUIRED without one, a source GID the table lacks, an MTU
 * above the port's); ECE and the data-in-order query. A QP moved to ERR
 * flushes its held sends and posted receives (fv_hold.c); one moved to
 * RESET drops them.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fv.h"

static const char *const state_names[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

struct sbuf {
	char s[900];
	size_t n;
};

static void add(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (b->n >= sizeof(b->s))
		return;
	va_start(ap, fmt);
	w = vsnprintf(b->s + b->n, sizeof(b->s) - b->n, fmt, ap);
	va_end(ap);
	if (w > 0)
		b->n += (size_t)w;
}

static void describe(struct sbuf *b, const struct ibv_qp_attr *a, int mask)
{
	char g[64];

	if (mask & IBV_QP_PKEY_INDEX) add(b, " pkey_index=%u", a->pkey_index);
	if (mask & IBV_QP_PORT) add(b, " port=%u", a->port_num);
	if (mask & IBV_QP_ACCESS_FLAGS) add(b, " access=0x%x", a->qp_access_flags);
	if (mask & IBV_QP_PATH_MTU) add(b, " path_mtu=%d", (int)a->path_mtu);
	if (mask & IBV_QP_DEST_QPN) add(b, " dest_qpn=0x%x", a->dest_qp_num);
	if (mask & IBV_QP_RQ_PSN) add(b, " rq_psn=%u", a->rq_psn);
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) add(b, " max_dest_rd_atomic=%u", a->max_dest_rd_atomic);
	if (mask & IBV_QP_MIN_RNR_TIMER) add(b, " min_rnr_timer=%u", a->min_rnr_timer);
	if (mask & IBV_QP_AV) {
		const struct ibv_ah_attr *ah = &a->ah_attr;

		add(b, " ah.is_global=%u ah.dlid=%u ah.sl=%u ah.src_path_bits=%u ah.port=%u "
		    "ah.static_rate=%u", ah->is_global, ah->dlid, ah->sl, ah->src_path_bits,
		    ah->port_num, ah->static_rate);
		if (ah->is_global)
			add(b, " ah.dgid=%s ah.sgid_index=%u ah.hop_limit=%u ah.traffic_class=%u "
			    "ah.flow_label=%u", fv_gid_str(&ah->grh.dgid, g, sizeof(g)),
			    ah->grh.sgid_index, ah->grh.hop_limit, ah->grh.traffic_class,
			    ah->grh.flow_label);
	}
	if (mask & IBV_QP_TIMEOUT) add(b, " timeout=%u", a->timeout);
	if (mask & IBV_QP_RETRY_CNT) add(b, " retry_cnt=%u", a->retry_cnt);
	if (mask & IBV_QP_RNR_RETRY) add(b, " rnr_retry=%u", a->rnr_retry);
	if (mask & IBV_QP_SQ_PSN) add(b, " sq_psn=%u", a->sq_psn);
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC) add(b, " max_rd_atomic=%u", a->max_rd_atomic);
}

/* Why the port refuses this address vector, or NULL. */
static const char *check_av(const struct fv_qp *q, const struct ibv_qp_attr *a, int mask)
{
	const struct ibv_ah_attr *ah = &a->ah_attr;
	int pn = ah->port_num ? ah->port_num : q->port;
	const struct fv_port *p;

	if (pn < 1 || pn > q->dev->nports)
		return "bad port";
	p = &q->dev->ports[pn - 1];
	if ((mask & IBV_QP_PATH_MTU) && (int)a->path_mtu > p->mtu)
		return "path_mtu above the port's active MTU";
	if (p->link_layer == IBV_LINK_LAYER_ETHERNET && !ah->is_global)
		return "RoCE needs a GRH";
	if (p->link_layer != IBV_LINK_LAYER_ETHERNET && (p->flags & IBV_QPF_GRH_REQUIRED) &&
	    !ah->is_global)
		return "the port requires a GRH (IBV_QPF_GRH_REQUIRED)";
	if (p->link_layer != IBV_LINK_LAYER_ETHERNET && ah->dlid == 0)
		return "dlid 0";
	if (ah->is_global && (ah->grh.sgid_index >= FV_MAX_GIDS ||
			      !p->gids[ah->grh.sgid_index].valid))
		return "sgid_index names no GID";
	return NULL;
}

static const char *check_transition(const struct fv_qp *q, int to)
{
	static const int from[] = { [IBV_QPS_INIT] = IBV_QPS_RESET, [IBV_QPS_RTR] = IBV_QPS_INIT,
				    [IBV_QPS_RTS] = IBV_QPS_RTR };

	if (to == IBV_QPS_ERR || to == IBV_QPS_RESET)
		return NULL;
	if (to > IBV_QPS_RTS || from[to] != q->state)
		return "state transition not allowed";
	return NULL;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;
	int to = (mask & IBV_QP_STATE) ? (int)a->qp_state : q->state;
	const char *why = NULL;
	struct sbuf b = { .n = 0 };

	if (to == IBV_QPS_RTR && q->dev->rtr_ms && (mask & IBV_QP_DEST_QPN) &&
	    a->dest_qp_num != qp->qp_num) {
		/* RoCE: the kernel resolves the peer's address; the fake's other calls go on */
		pthread_mutex_lock(&fv_lock);
		fv_log("rtr_wait dev=%s qpn=0x%x ms=%d", q->dev->ibdev.name, qp->qp_num,
		       q->dev->rtr_ms);
		pthread_mutex_unlock(&fv_lock);
		usleep((useconds_t)q->dev->rtr_ms * 1000);
	}
	pthread_mutex_lock(&fv_lock);
	fv_progress();
	add(&b, "ibv_modify_qp dev=%s qpn=0x%x state=%s mask=0x%x", q->dev->ibdev.name,
	    qp->qp_num, to >= 0 && to <= IBV_QPS_ERR ? state_names[to] : "?", mask);
	describe(&b, a, mask);
	why = check_transition(q, to);
	if (!why && (mask & IBV_QP_PORT) && (a->port_num < 1 || a->port_num > q->dev->nports))
		why = "bad port";
	if (!why && (mask & IBV_QP_AV))
		why = check_av(q, a, mask);
	if (!why && q->dev->fail_left > 0 && to == q->dev->fail_state) {
		int err = q->dev->fail_err;

		q->dev->fail_left--;
		fv_log("%s ret=%s modify_fail left=%d", b.s, err == ETIMEDOUT ? "ETIMEDOUT"
			       : err == EINVAL ? "EINVAL" : "error", q->dev->fail_left);
		pthread_mutex_unlock(&fv_lock);
		errno = err;
		return err;
	}
	if (why) {
		fv_log("%s ret=EINVAL why=\"%s\"", b.s, why);
		pthread_mutex_unlock(&fv_lock);
		errno = EINVAL;
		return EINVAL;
	}
	fv_log("%s ret=0", b.s);
	if (mask & IBV_QP_PORT)
		q->port = a->port_num;
	if (mask & IBV_QP_ACCESS_FLAGS)
		q->access = (int)a->qp_access_flags;
	if (mask & IBV_QP_DEST_QPN)
		q->dest_qpn = a->dest_qp_num;
	if (mask & IBV_QP_PATH_MTU)
		q->path_mtu = (int)a->path_mtu;
	if (mask & IBV_QP_SQ_PSN)
		q->sq_psn = a->sq_psn & FV_PSN_MASK;
	if (mask & IBV_QP_RQ_PSN)
		q->rq_psn = a->rq_psn & FV_PSN_MASK;
	if (to == IBV_QPS_RESET) {
		q->rcount = 0;
		fv_hold_drop(q);
	}
	if (to == IBV_QPS_ERR)
		fv_qp_error(q);	/* flushes what is held and posted (fv_hold.c) */
	q->state = to;
	qp->state = (enum ibv_qp_state)to;
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

/*
 * The state, port, destination QP, path MTU and PSNs (whatever the mask
 * asks: a real provider may fill more than it is asked for).
 */
int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;

	pthread_mutex_lock(&fv_lock);
	fv_progress();
	memset(a, 0, sizeof(*a));
	if (ia)
		memset(ia, 0, sizeof(*ia));
	a->qp_state = (enum ibv_qp_state)q->state;
	a->cur_qp_state = a->qp_state;
	a->port_num = (uint8_t)q->port;
	a->dest_qp_num = q->dest_qpn;
	a->path_mtu = (enum ibv_mtu)q->path_mtu;
	a->sq_psn = q->sq_psn;
	a->rq_psn = q->rq_psn;
	fv_log("ibv_query_qp dev=%s qpn=0x%x mask=0x%x state=%s sq_psn=%u rq_psn=%u ret=0",
	       q->dev->ibdev.name, qp->qp_num, mask,
	       q->state >= 0 && q->state <= IBV_QPS_ERR ? state_names[q->state] : "?", q->sq_psn,
	       q->rq_psn);
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;
	int ret = q->dev->ece ? 0 : EOPNOTSUPP;

	if (!ret) {
		memset(ece, 0, sizeof(*ece));
		ece->vendor_id = 0x15b3;
		ece->options = q->ece_set ? q->ece_options : (uint32_t)q->dev->ece;
	}
	pthread_mutex_lock(&fv_lock);
	fv_log("ibv_query_ece dev=%s qpn=0x%x ret=%d options=0x%x", q->dev->ibdev.name,
	       qp->qp_num, ret, ret ? 0 : ece->options);
	pthread_mutex_unlock(&fv_lock);
	return ret;
}

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;
	int ret = q->dev->ece ? 0 : EOPNOTSUPP;

	pthread_mutex_lock(&fv_lock);
	if (!ret) {
		/* as mlx5: the QP keeps the options both sides have */
		q->ece_set = 1;
		q->ece_options = ece->options & (uint32_t)q->dev->ece;
	}
	fv_log("ibv_set_ece dev=%s qpn=0x%x vendor_id=0x%x options=0x%x ret=%d",
	       q->dev->ibdev.name, qp->qp_num, ece->vendor_id, ece->options, ret);
	pthread_mutex_unlock(&fv_lock);
	return ret;
}

/*
 * data_in_order in the description is the capability mask (bit 0 whole
 * message, bit 1 128-byte aligned blocks); without flags the answer is 1
 * for whole-message ordering only.
 */
int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;
	int caps = q->dev->data_in_order, ret = flags ? caps : (caps & 1);

	pthread_mutex_lock(&fv_lock);
	fv_log("ibv_query_qp_data_in_order dev=%s qpn=0x%x op=%d flags=0x%x ret=%d",
	       q->dev->ibdev.name, qp->qp_num, (int)op, flags, ret);
	pthread_mutex_unlock(&fv_lock);
	return ret;
}
