/*
 * nccl-net-rail: the tuner NCCL finds in the plugin's library. It corrects
 * one figure of NCCL's cost model for this plugin's TCP transport: the cost
 * of the LL protocol, which NCCL takes to be half the network's speed and
 * which over TCP is far lower. Nothing else is changed, and nothing at all
 * on verbs, on one node, or when NCCL uses another network.
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
void rail_tuner_close(struct rail_tuner *t);

#endif
