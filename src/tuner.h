/*
 * nccl-net-rail: the tuner NCCL finds in the plugin's library. It corrects
 * two things of NCCL's plan for this plugin's TCP transport: the cost of the
 * LL protocol, which NCCL takes to be half the network's speed and which over
 * TCP is far lower; and the channels of a mid-size ring collective, whose
 * per-step messages NCCL lets shrink below what TCP moves well. Nothing else
 * is changed, and nothing at all on verbs, on one node, or when NCCL uses
 * another network.
 */
#ifndef RAIL_TUNER_H
#define RAIL_TUNER_H

#include <stddef.h>

struct rail_tuner;

/*
 * A context for one communicator of nranks over nnodes, never NULL on
 * success (-ENOMEM otherwise): inactive when there is nothing to correct.
 */
int rail_tuner_open(size_t nranks, size_t nnodes, struct rail_tuner **out);
/*
 * NCCL's cost table for one collective of nbytes (any collective: the rule
 * does not depend on which): nalgo x nproto floats in microseconds, negative
 * for pairs NCCL does not consider (left as they are).
 */
void rail_tuner_adjust(struct rail_tuner *t, size_t nbytes, float *table, int nalgo, int nproto);
/*
 * After rail_tuner_adjust: the channels to ask NCCL for a collective coll
 * (ncclFunc_t) of nbytes whose cheapest entry in table is Ring with Simple,
 * so that a ring step moves at least NCCL_RAIL_TCP_MIN_STEP bytes: 1 or 2;
 * 0 to leave NCCL's count (larger collectives, other algorithms, or
 * inactive). NCCL caps the answer at the channels it opened.
 */
int rail_tuner_channels(const struct rail_tuner *t, int coll, size_t nbytes, const float *table,
			int nalgo, int nproto);
void rail_tuner_close(struct rail_tuner *t);

#endif
