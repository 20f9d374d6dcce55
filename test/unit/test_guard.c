/*
 * nccl-net-rail unit tests: the guard of a guarded comm (src/transport.h,
 * the owner's half in src/api_int.h): an asymmetric Dekker protocol, plain
 * stores and a compiler barrier on NCCL's side, membarrier (or, without
 * it, full fences on both sides) on the transport thread's. A seeded
 * stress: one owner thread per comm enters and leaves as NCCL's calls do,
 * one mover takes random batches of the comms as the move thread does;
 * each side, once in, checks that the other is not (a plain flag) and
 * bumps a plain counter. Any overlap shows as a flag seen set or as a
 * lost update (and, under TSan, as a race). RAIL_TEST_SEED=N replays the
 * random choices of a run (its seed is printed); RAIL_TEST_ITERS scales it.
 */
#include "unit.h"

#include <sched.h>

#include "api_int.h"
#include "rail.h"
#include "transport.h"

#define NCOMMS 4

struct gcomm {
	struct rail_comm c;
	/* plain (not atomic: the guard is to protect them); volatile, so none is optimised away */
	volatile int inside;	/* 1 owner, 2 mover */
	volatile unsigned long count;	/* bumped by both sides inside */
	unsigned long owner_in, mover_in, overlaps;
};

static struct gcomm comms[NCOMMS];
static unsigned long iters;		/* each owner's calls at least, and the mover's rounds */
static atomic_int mover_done;

static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* A little work inside, of a random length: widens the window an overlap needs. */
static void inside(struct gcomm *g, int who, uint32_t *s)
{
	unsigned spin = rnd(s) % 4096;

	if (g->inside)
		g->overlaps++;
	g->inside = who;
	for (volatile unsigned k = 0; k < spin; k++)
		;
	g->count++;
	if (g->inside != who)
		g->overlaps++;
	g->inside = 0;
}

struct owner_arg {
	struct gcomm *g;
	uint32_t seed;
};

static void *owner(void *p)
{
	struct owner_arg *a = p;
	uint32_t s = a->seed;
	uint64_t end = rail_now_ns() + 30000000000ull;

	/* iters entries, not attempts: on a loaded machine the mover may hold it for many */
	while ((a->g->owner_in < iters || !atomic_load(&mover_done)) && rail_now_ns() < end) {
		if (!comm_enter(&a->g->c)) {
			if (rnd(&s) % 4 == 0)
				sched_yield();	/* NCCL answered "not now": it comes back */
			continue;
		}
		inside(a->g, 1, &s);
		a->g->owner_in++;
		comm_leave(&a->g->c);
		for (volatile unsigned k = rnd(&s) % 128; k; k--)
			;	/* the proxy thread's work on other comms */
	}
	return NULL;
}

static void *mover(void *p)
{
	uint32_t s = *(uint32_t *)p;
	struct rail_comm *v[NCOMMS];
	unsigned char taken[NCOMMS];
	unsigned long in = 0;
	uint64_t end = rail_now_ns() + 30000000000ull;

	while (in < iters / 32 && rail_now_ns() < end) {
		uint32_t pick = rnd(&s) % (1u << NCOMMS);

		for (int i = 0; i < NCOMMS; i++)
			v[i] = pick & (1u << i) ? &comms[i].c : NULL;
		rail_guard_take(v, NCOMMS, taken);
		for (int i = 0; i < NCOMMS; i++) {
			if (!taken[i])
				continue;
			inside(&comms[i], 2, &s);
			comms[i].mover_in++;
			in++;
			rail_guard_give(v[i]);
		}
	}
	atomic_store(&mover_done, 1);
	return NULL;
}

static void run(int fence)
{
	const char *env = getenv("RAIL_TEST_SEED");
	uint32_t seed = env ? (uint32_t)strtoul(env, NULL, 0) : (uint32_t)rail_now_ns() | 1;
	struct owner_arg oa[NCOMMS];
	pthread_t ot[NCOMMS], mt;
	uint32_t ms = seed * 2654435761u | 1;
	unsigned long in = 0;
	int guarded;

	iters = getenv("RAIL_TEST_ITERS") ? strtoul(getenv("RAIL_TEST_ITERS"), NULL, 0) : 200000;
	guarded = rail_guard_force_fence(fence);
	print_message("guard stress, %s: seed=%u iters=%lu (replay: RAIL_TEST_SEED=%u)\n",
		      atomic_load(&rail_guard_fence) ? "full fences" : "membarrier", seed, iters,
		      seed);
	memset(comms, 0, sizeof(comms));
	atomic_store(&mover_done, 0);
	for (int i = 0; i < NCOMMS; i++) {
		comms[i].c.guarded = guarded;
		oa[i].g = &comms[i];
		oa[i].seed = (seed + 0x9e3779b9u * (uint32_t)(i + 1)) | 1;
		assert_int_equal(pthread_create(&ot[i], NULL, owner, &oa[i]), 0);
	}
	assert_int_equal(pthread_create(&mt, NULL, mover, &ms), 0);
	for (int i = 0; i < NCOMMS; i++)
		pthread_join(ot[i], NULL);
	pthread_join(mt, NULL);
	for (int i = 0; i < NCOMMS; i++) {
		struct gcomm *g = &comms[i];

		if (g->overlaps || g->count != g->owner_in + g->mover_in)
			fail_msg("comm %d: %lu overlaps, count %lu != %lu owner + %lu mover entries "
				 "(replay: RAIL_TEST_SEED=%u)", i, g->overlaps, g->count, g->owner_in,
				 g->mover_in, seed);
		in += g->mover_in;
	}
	/* the test tests something only if both sides got in, often */
	for (int i = 0; i < NCOMMS; i++)
		assert_true(comms[i].owner_in >= iters / 2);
	assert_true(in >= iters / 32);
	print_message("  owner entries %lu..., mover entries %lu in all\n", comms[0].owner_in, in);
}

static void test_guard_membarrier(void **state)
{
	(void)state;
	run(0);
}

static void test_guard_fences(void **state)
{
	(void)state;
	run(1);
}

/* An owner that finds the mover in backs off and leaves no trace: the mover then gets in. */
static void test_guard_backoff(void **state)
{
	struct rail_comm c;
	struct rail_comm *v[1] = { &c };
	unsigned char taken[1];

	(void)state;
	memset(&c, 0, sizeof(c));
	c.guarded = rail_guard_force_fence(0);
	assert_int_equal(rail_guard_take(v, 1, taken), 1);
	assert_false(comm_enter(&c));		/* the mover has it: "not now" */
	assert_int_equal(atomic_load(&c.in_call), 0);
	assert_int_equal(atomic_load(&c.calls), 1);	/* counted all the same */
	rail_guard_give(&c);
	assert_true(comm_enter(&c));
	assert_int_equal(rail_guard_take(v, 1, taken), 0);	/* the owner has it */
	assert_int_equal(atomic_load(&c.mover), 0);
	comm_leave(&c);
	assert_int_equal(rail_guard_take(v, 1, taken), 1);
	rail_guard_give(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_guard_backoff),
		cmocka_unit_test(test_guard_membarrier),
		cmocka_unit_test(test_guard_fences),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
