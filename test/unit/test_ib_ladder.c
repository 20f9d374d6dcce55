/*
 * nccl-net-rail unit tests: the GPU-memory ladder (src/ib/ib_ladder.c) with
 * a substituted ibv_reg_dmabuf_mr (the wrapper table is the mock seam) and a
 * sysfs root made here for the peermem files.
 */
#include "unit.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ib/ib.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

static int probe_errno;
static int probe_calls;

static struct ibv_mr *fake_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					 uint64_t iova, int fd, int access)
{
	(void)pd;
	(void)offset;
	(void)len;
	(void)iova;
	(void)access;
	probe_calls++;
	assert_int_equal(fd, -1);
	errno = probe_errno;
	return NULL;
}

static char root[64];

static void write_file(const char *rel, const char *text)
{
	char path[256], *slash;
	FILE *f;

	snprintf(path, sizeof(path), "%s%s", root, rel);
	for (slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		mkdir(path, 0755);
		*slash = '/';
	}
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof(root), "/tmp/rail-ladder-XXXXXX");
	assert_non_null(mkdtemp(root));
	mkdir(strcat(strcpy((char[128]){0}, root), "/sys"), 0755);
	rail_sysfs_set_root(root);
	unsetenv("NCCL_DMABUF_ENABLE");
	rail_params_reload();
	memset(&rail_ibv, 0, sizeof(rail_ibv));
	rail_ibv.reg_dmabuf_mr = fake_reg_dmabuf_mr;
	probe_calls = 0;
	unit_log_capture();
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	unit_log_release();
	rail_sysfs_set_root("");
	memset(&rail_ibv, 0, sizeof(rail_ibv));
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
	return 0;
}

static void decide(struct rail_ib_ladder *l)
{
	struct rail_ib_hca hca;

	memset(&hca, 0, sizeof(hca));
	rail_strlcpy(hca.name, "mlx5_0", sizeof(hca.name));
	rail_ib_ladder_decide(&hca, l);
}

static void test_dmabuf_supported(void **state)
{
	struct rail_ib_ladder l;

	(void)state;
	probe_errno = EBADF;	/* the driver looked at the fd: supported */
	decide(&l);
	assert_int_equal(l.dmabuf, 1);
	assert_int_equal(rail_ib_ladder_ptr_support(&l), RAIL_PTR_HOST | RAIL_PTR_DMABUF);
	assert_string_equal(l.summary, "GPU memory via DMA-BUF");
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5_0: GPU memory via DMA-BUF", "peermem");
}

static void test_dmabuf_unsupported_peermem(void **state)
{
	struct rail_ib_ladder l;

	(void)state;
	write_file("/sys/module/nvidia_peermem/version", "580.1\n");
	for (int e = 0; e < 2; e++) {
		probe_errno = e ? EPROTONOSUPPORT : EOPNOTSUPP;
		decide(&l);
		assert_int_equal(l.dmabuf, 0);
		assert_int_equal(l.peermem, 1);
		assert_int_equal(rail_ib_ladder_ptr_support(&l), RAIL_PTR_HOST | RAIL_PTR_CUDA);
		assert_non_null(strstr(l.peermem_why, "nvidia_peermem/version = 580.1"));
	}
	/* One line: the rung used and why the higher one failed. */
	unit_assert_logged2(RAIL_LOG_INFO, "GPU memory via peermem", "DMA-BUF is unusable");
}

static void test_host_only(void **state)
{
	struct rail_ib_ladder l;

	(void)state;
	probe_errno = EOPNOTSUPP;
	decide(&l);
	assert_int_equal(rail_ib_ladder_ptr_support(&l), RAIL_PTR_HOST);
	assert_string_equal(l.summary, "host memory only");
	unit_assert_logged2(RAIL_LOG_INFO, "host memory only", "peermem absent");
	unit_assert_logged2(RAIL_LOG_INFO, "host memory only", "Operation not supported");
}

static void test_missing_symbol_and_disabled(void **state)
{
	struct rail_ib_ladder l;

	(void)state;
	rail_ibv.reg_dmabuf_mr = NULL;
	decide(&l);
	assert_int_equal(l.dmabuf, 0);
	assert_non_null(strstr(l.dmabuf_why, "IBVERBS_1.12"));
	rail_ibv.reg_dmabuf_mr = fake_reg_dmabuf_mr;
	setenv("NCCL_DMABUF_ENABLE", "0", 1);
	rail_params_reload();
	probe_errno = EBADF;
	decide(&l);
	unsetenv("NCCL_DMABUF_ENABLE");
	rail_params_reload();
	assert_int_equal(l.dmabuf, 0);
	assert_int_equal(probe_calls, 0);
	assert_non_null(strstr(l.dmabuf_why, "NCCL_DMABUF_ENABLE=0"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_dmabuf_supported, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dmabuf_unsupported_peermem, setup, teardown),
		cmocka_unit_test_setup_teardown(test_host_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_symbol_and_disabled, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
