/*
 * nccl-net-rail: the GPU-memory ladder, decided per HCA at init and logged
 * in one line: DMA-BUF (ibv_reg_dmabuf_mr probed with fd -1: EOPNOTSUPP or
 * EPROTONOSUPPORT, or a libibverbs without the call, mean unsupported; any
 * other error means the driver got as far as checking the fd), else
 * peermem (nvidia-peermem's sysfs files), else host memory only.
 */
#include <stdio.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

static const char *const peermem_files[] = {
	"/sys/kernel/mm/memory_peers/nv_mem/version",
	"/sys/kernel/mm/memory_peers/nv_mem_nc/version",
	"/sys/module/nvidia_peermem/version",
};

/* 1 with the file found in why, or 0 with why listing what was missing. */
static int peermem_check(char *why, size_t why_len)
{
	char ver[64];

	for (size_t i = 0; i < RAIL_ARRAY_SIZE(peermem_files); i++) {
		if (rail_sysfs_read(peermem_files[i], ver, sizeof(ver)) >= 0) {
			snprintf(why, why_len, "%s = %s", peermem_files[i], ver);
			return 1;
		}
	}
	snprintf(why, why_len, "no nv_mem, nv_mem_nc or nvidia_peermem version file in sysfs "
		 "(load nvidia-peermem)");
	return 0;
}

static int dmabuf_probe(struct rail_ib_hca *hca, char *why, size_t why_len)
{
	struct ibv_mr *mr;
	int err;

	if (!rail_param_int(RAIL_P_DMABUF_ENABLE)) {
		snprintf(why, why_len, "disabled by NCCL_DMABUF_ENABLE=0");
		return 0;
	}
	if (!rail_ibv.reg_dmabuf_mr) {
		snprintf(why, why_len, "libibverbs has no ibv_reg_dmabuf_mr@IBVERBS_1.12 "
			 "(rdma-core older than 34)");
		return 0;
	}
	errno = 0;
	mr = rail_ibv.reg_dmabuf_mr(hca->pd, 0, 0, 0, -1, 0);
	if (mr) {
		/* No driver should accept fd -1; treat it as support and drop the MR. */
		rail_ibv.dereg_mr(mr);
		snprintf(why, why_len, "ibv_reg_dmabuf_mr(fd -1) succeeded");
		return 1;
	}
	err = errno;
	if (err == EOPNOTSUPP || err == EPROTONOSUPPORT) {
		snprintf(why, why_len, "ibv_reg_dmabuf_mr(fd -1) returned %s: the %s driver "
			 "cannot import DMA-BUF", RAIL_ERRSTR(-err), hca->name);
		return 0;
	}
	snprintf(why, why_len, "ibv_reg_dmabuf_mr(fd -1) returned %s: the driver checked the fd, "
		 "so it supports DMA-BUF", err ? RAIL_ERRSTR(-err) : "an error");
	return 1;
}

void rail_ib_ladder_decide(struct rail_ib_hca *hca, struct rail_ib_ladder *out)
{
	struct rail_ib_ladder l;

	memset(&l, 0, sizeof(l));
	l.dmabuf = dmabuf_probe(hca, l.dmabuf_why, sizeof(l.dmabuf_why));
	l.peermem = peermem_check(l.peermem_why, sizeof(l.peermem_why));
	if (l.dmabuf)
		snprintf(l.summary, sizeof(l.summary), "GPU memory via DMA-BUF%s",
			 l.peermem ? " (peermem also present)" : "");
	else if (l.peermem)
		snprintf(l.summary, sizeof(l.summary), "GPU memory via peermem");
	else
		snprintf(l.summary, sizeof(l.summary), "host memory only");
	*out = l;
	if (l.dmabuf)
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: %s (DMA-BUF: %s; peermem: %s)",
			  hca->name, l.summary, l.dmabuf_why, l.peermem_why);
	else if (l.peermem)
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: %s (%s) because DMA-BUF is unusable: %s",
			  hca->name, l.summary, l.peermem_why, l.dmabuf_why);
	else
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: %s: DMA-BUF unusable (%s); peermem "
			  "absent (%s)", hca->name, l.summary, l.dmabuf_why, l.peermem_why);
}

int rail_ib_ladder_ptr_support(const struct rail_ib_ladder *l)
{
	return RAIL_PTR_HOST | (l->peermem ? RAIL_PTR_CUDA : 0) | (l->dmabuf ? RAIL_PTR_DMABUF : 0);
}
