/* nccl-net-rail unit tests: the fixed-capacity request pool (src/pool.c). */
#include "unit.h"

#include <errno.h>

#include "pool.h"
#include "rail.h"

struct item {
	uint64_t a;
	char text[40];
	uint32_t b;
};

static int is_zero(const void *p, size_t n)
{
	const unsigned char *c = p;

	for (size_t i = 0; i < n; i++)
		if (c[i])
			return 0;
	return 1;
}

static void test_init_rejects(void **state)
{
	struct rail_pool pool;

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 0, 16), -EINVAL);
	assert_int_equal(rail_pool_init(&pool, 4, 0), -EINVAL);
}

static void test_capacity_exhaustion(void **state)
{
	struct rail_pool pool;
	void *e[8];

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 8, sizeof(struct item)), 0);
	assert_int_equal(rail_pool_in_use(&pool), 0);
	for (int i = 0; i < 8; i++) {
		e[i] = rail_pool_get(&pool);
		assert_non_null(e[i]);
		assert_int_equal(rail_pool_in_use(&pool), i + 1);
		for (int j = 0; j < i; j++)
			assert_ptr_not_equal(e[i], e[j]);
	}
	assert_null(rail_pool_get(&pool));
	assert_null(rail_pool_get(&pool));
	assert_int_equal(rail_pool_in_use(&pool), 8);
	/* One back, one more out, and it is the one returned. */
	assert_int_equal(rail_pool_put(&pool, e[3]), 0);
	assert_int_equal(rail_pool_in_use(&pool), 7);
	assert_ptr_equal(rail_pool_get(&pool), e[3]);
	assert_null(rail_pool_get(&pool));
	for (int i = 0; i < 8; i++)
		assert_int_equal(rail_pool_put(&pool, e[i]), 0);
	assert_int_equal(rail_pool_in_use(&pool), 0);
	rail_pool_destroy(&pool);
}

static void test_get_returns_zeroed(void **state)
{
	struct rail_pool pool;
	struct item *it;

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 2, sizeof(struct item)), 0);
	it = rail_pool_get(&pool);
	assert_non_null(it);
	assert_true(is_zero(it, sizeof(*it)));
	memset(it, 0xff, sizeof(*it)); /* the whole element is the caller's */
	assert_int_equal(rail_pool_put(&pool, it), 0);
	/* LIFO: the dirty element comes back, cleared. */
	it = rail_pool_get(&pool);
	assert_non_null(it);
	assert_true(is_zero(it, sizeof(*it)));
	/* Writing the whole element did not break the in-use bookkeeping. */
	memset(it, 0xff, sizeof(*it));
	assert_int_equal(rail_pool_in_use(&pool), 1);
	assert_int_equal(rail_pool_put(&pool, it), 0);
	assert_int_equal(rail_pool_put(&pool, it), -EINVAL);
	rail_pool_destroy(&pool);
}

/* Element sizes that are already a multiple of 64 still leave room for bookkeeping. */
static void test_full_size_elements(void **state)
{
	static const size_t sizes[] = { 1, 63, 64, 65, 127, 128, 4096 };

	(void)state;
	for (size_t s = 0; s < RAIL_ARRAY_SIZE(sizes); s++) {
		struct rail_pool pool;
		unsigned char *e[3];

		assert_int_equal(rail_pool_init(&pool, 3, sizes[s]), 0);
		for (int i = 0; i < 3; i++) {
			e[i] = rail_pool_get(&pool);
			assert_non_null(e[i]);
			assert_true(is_zero(e[i], sizes[s]));
			memset(e[i], 0xff, sizes[s]);
		}
		/* No element overlaps another. */
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 3; j++)
				if (i != j)
					assert_true(e[i] + sizes[s] <= e[j] ||
						    e[j] + sizes[s] <= e[i]);
		for (int i = 0; i < 3; i++)
			assert_int_equal(rail_pool_put(&pool, e[i]), 0);
		for (int i = 0; i < 3; i++)
			assert_int_equal(rail_pool_put(&pool, e[i]), -EINVAL);
		assert_int_equal(rail_pool_in_use(&pool), 0);
		rail_pool_destroy(&pool);
	}
}

static void test_double_put(void **state)
{
	struct rail_pool pool;
	void *a, *b;

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 4, 24), 0);
	a = rail_pool_get(&pool);
	b = rail_pool_get(&pool);
	assert_int_equal(rail_pool_put(&pool, a), 0);
	assert_int_equal(rail_pool_put(&pool, a), -EINVAL);
	assert_int_equal(rail_pool_in_use(&pool), 1);
	/* The failed put did not push a duplicate: only 3 more fit. */
	assert_non_null(rail_pool_get(&pool));
	assert_non_null(rail_pool_get(&pool));
	assert_non_null(rail_pool_get(&pool));
	assert_null(rail_pool_get(&pool));
	(void)b;
	rail_pool_destroy(&pool);
}

static void test_never_handed_out(void **state)
{
	struct rail_pool pool;

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 4, 24), 0);
	/* A real slot, but free: putting it is a double free. */
	assert_true(rail_pool_owns(&pool, rail_pool_at(&pool, 2)));
	assert_int_equal(rail_pool_put(&pool, rail_pool_at(&pool, 2)), -EINVAL);
	assert_int_equal(rail_pool_in_use(&pool), 0);
	rail_pool_destroy(&pool);
}

static void test_foreign_pointer(void **state)
{
	struct rail_pool pool, other;
	unsigned char *e;
	void *o;
	int local;

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 4, 24), 0);
	assert_int_equal(rail_pool_init(&other, 4, 24), 0);
	e = rail_pool_get(&pool);
	o = rail_pool_get(&other);
	assert_true(rail_pool_owns(&pool, e));
	assert_false(rail_pool_owns(&pool, o));
	assert_int_equal(rail_pool_put(&pool, o), -EINVAL);
	assert_int_equal(rail_pool_put(&pool, &local), -EINVAL);
	assert_int_equal(rail_pool_put(&pool, NULL), -EINVAL);
	/* Inside the pool but not at the start of an element. */
	assert_false(rail_pool_owns(&pool, e + 1));
	assert_int_equal(rail_pool_put(&pool, e + 1), -EINVAL);
	assert_int_equal(rail_pool_put(&pool, e + 8), -EINVAL);
	/* One past the last element. */
	assert_false(rail_pool_owns(&pool, (unsigned char *)rail_pool_at(&pool, 3) +
						   ((unsigned char *)rail_pool_at(&pool, 1) -
						    (unsigned char *)rail_pool_at(&pool, 0))));
	assert_int_equal(rail_pool_in_use(&pool), 1);
	assert_int_equal(rail_pool_in_use(&other), 1);
	assert_int_equal(rail_pool_put(&pool, e), 0);
	assert_int_equal(rail_pool_put(&other, o), 0);
	rail_pool_destroy(&pool);
	rail_pool_destroy(&other);
	/* A destroyed pool owns nothing. */
	assert_false(rail_pool_owns(&pool, e));
}

static void test_alignment_and_at(void **state)
{
	static const size_t sizes[] = { 1, 24, 63, 64, 100, 200 };

	(void)state;
	for (size_t s = 0; s < RAIL_ARRAY_SIZE(sizes); s++) {
		struct rail_pool pool;

		assert_int_equal(rail_pool_init(&pool, 5, sizes[s]), 0);
		for (uint32_t i = 0; i < 5; i++) {
			void *at = rail_pool_at(&pool, i);

			assert_non_null(at);
			assert_int_equal((uintptr_t)at % 64, 0);
			assert_true(rail_pool_owns(&pool, at));
		}
		assert_null(rail_pool_at(&pool, 5));
		for (int i = 0; i < 5; i++) {
			void *e = rail_pool_get(&pool);

			assert_non_null(e);
			assert_int_equal((uintptr_t)e % 64, 0);
		}
		rail_pool_destroy(&pool);
	}
}

/* Low indices first: request ids stay small and predictable. */
static void test_order(void **state)
{
	struct rail_pool pool;

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 3, 8), 0);
	assert_ptr_equal(rail_pool_get(&pool), rail_pool_at(&pool, 0));
	assert_ptr_equal(rail_pool_get(&pool), rail_pool_at(&pool, 1));
	assert_ptr_equal(rail_pool_get(&pool), rail_pool_at(&pool, 2));
	rail_pool_destroy(&pool);
}

static void test_capacity_32(void **state)
{
	struct rail_pool pool;
	void *e[32];

	(void)state;
	assert_int_equal(rail_pool_init(&pool, 32, 256), 0);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 32; i++)
			assert_non_null(e[i] = rail_pool_get(&pool));
		assert_null(rail_pool_get(&pool));
		/* Return them in an interleaved order. */
		for (int i = 0; i < 32; i += 2)
			assert_int_equal(rail_pool_put(&pool, e[i]), 0);
		for (int i = 1; i < 32; i += 2)
			assert_int_equal(rail_pool_put(&pool, e[i]), 0);
		assert_int_equal(rail_pool_in_use(&pool), 0);
	}
	rail_pool_destroy(&pool);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_rejects),
		cmocka_unit_test(test_capacity_exhaustion),
		cmocka_unit_test(test_get_returns_zeroed),
		cmocka_unit_test(test_full_size_elements),
		cmocka_unit_test(test_double_put),
		cmocka_unit_test(test_never_handed_out),
		cmocka_unit_test(test_foreign_pointer),
		cmocka_unit_test(test_alignment_and_at),
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_capacity_32),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
