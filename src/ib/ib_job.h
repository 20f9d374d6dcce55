/*
 * nccl-net-rail: the verbs handshakes' helper threads (ib_job.c).
 *
 * A handshake step that may block (QP creation, ibv_modify_qp to RTR, which
 * resolves the peer's address on RoCE and may be retried) runs as a job on
 * a helper thread while NCCL's thread polls rail_ib_job_done. The threads
 * are shared by every handshake of the process: a job goes to an idle one,
 * and a new one starts only when none is idle, so as many jobs run at once
 * as before (a slow RTR never holds up another handshake) without a thread
 * created and joined per step. A thread idle for a second exits.
 */
#ifndef RAIL_IB_JOB_H
#define RAIL_IB_JOB_H

#include <stdatomic.h>

#include "ib/ib.h"

struct rail_ib_job {
	void (*fn)(struct rail_ib_job *j);	/* runs on a helper thread */
	const struct rail_ib_mqp_retry *retry;	/* its ibv_modify_qp retry policy (ib_mqp.c) */
	atomic_int done;			/* set after fn returned */
	int state;				/* under the pool's lock (ib_job.c) */
	struct rail_ib_job *next;
};

/* Queue j: 0, or a negative errno when no helper thread exists nor can start (run it yourself). */
int rail_ib_job_start(struct rail_ib_job *j);
/* 1 once fn has returned (then j may be started again or freed). */
int rail_ib_job_done(struct rail_ib_job *j);
/*
 * Wait for j: a queued job is taken back without running (0), a running one
 * waited for (1); 0 when it was never started or already waited for.
 */
int rail_ib_job_cancel(struct rail_ib_job *j);
/* Every helper thread ends (their jobs finish first); at the transport's fini. */
void rail_ib_job_fini(void);

#endif
