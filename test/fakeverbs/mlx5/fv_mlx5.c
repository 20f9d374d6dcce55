/*
 * fakeverbs: a libmlx5 stand-in with the three direct-verbs calls
 * nccl-net-rail binds for mlx5 Data Direct (fakemlx5.map gives rdma-core's
 * versions: MLX5_1.8, MLX5_1.25). It works on the fake libibverbs' devices
 * (it links libfakeverbs.so and uses its FAKEVERBS_PRIVATE calls) and logs
 * to the same call log. Point NCCL_RAIL_MLX5_LIB at it.
 *
 *   mlx5dv_is_supported                true for devices named mlx5*
 *   mlx5dv_get_data_direct_sysfs_path  the device's data_direct= path, else ENODEV
 *   mlx5dv_reg_dmabuf_mr               fd -1: EBADF (dmabuf=yes) or EOPNOTSUPP;
 *                                      the Data Direct bit on a device without
 *                                      data_direct=: EOPNOTSUPP; else a DMA-BUF MR
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../fv.h"

#define FV_MLX5_DATA_DIRECT 1	/* MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT */

bool mlx5dv_is_supported(struct ibv_device *device);
int mlx5dv_get_data_direct_sysfs_path(struct ibv_context *context, char *buf, size_t buf_len);
struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				    uint64_t iova, int fd, int access, int mlx5_access);

bool mlx5dv_is_supported(struct ibv_device *device)
{
	/* The fake's ibv_device is the first member of its fv_dev. */
	const struct fv_dev *d = (const struct fv_dev *)(void *)device;
	bool yes = !strncmp(d->ibdev.name, "mlx5", 4);

	pthread_mutex_lock(&fv_lock);
	fv_log("mlx5dv_is_supported dev=%s ret=%d", d->ibdev.name, yes);
	pthread_mutex_unlock(&fv_lock);
	return yes;
}

int mlx5dv_get_data_direct_sysfs_path(struct ibv_context *context, char *buf, size_t buf_len)
{
	const struct fv_dev *d = fv_ctx_dev(context);
	int ret = 0;

	if (!d->data_direct[0])
		ret = ENODEV;
	else if (strlen(d->data_direct) >= buf_len)
		ret = ENOSPC;
	else
		snprintf(buf, buf_len, "%s", d->data_direct);
	pthread_mutex_lock(&fv_lock);
	fv_log("mlx5dv_get_data_direct_sysfs_path dev=%s ret=%s%s%s", d->ibdev.name,
	       ret == ENODEV ? "ENODEV" : ret ? "ENOSPC" : "0", ret ? "" : " path=",
	       ret ? "" : d->data_direct);
	pthread_mutex_unlock(&fv_lock);
	return ret;
}

struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				    uint64_t iova, int fd, int access, int mlx5_access)
{
	const struct fv_dev *d = fv_ctx_dev(pd->context);
	char extra[32];

	if (fd < 0 || ((mlx5_access & FV_MLX5_DATA_DIRECT) && !d->data_direct[0])) {
		int err = fd < 0 && d->dmabuf ? EBADF : EOPNOTSUPP;

		pthread_mutex_lock(&fv_lock);
		fv_log("mlx5dv_reg_dmabuf_mr dev=%s fd=%d mlx5_access=0x%x ret=%s", d->ibdev.name,
		       fd, mlx5_access, err == EBADF ? "EBADF" : "EOPNOTSUPP");
		pthread_mutex_unlock(&fv_lock);
		errno = err;
		return NULL;
	}
	snprintf(extra, sizeof(extra), " mlx5_access=0x%x", mlx5_access);
	return fv_mr_new("mlx5dv_reg_dmabuf_mr", pd, NULL, length, iova, access, fd, offset,
			 extra);
}
