/*
 * fakeverbs: a libmlx5 from before rdma-core 54, as far as nccl-net-rail can
 * tell: a provider library that registers itself with libibverbs when
 * loaded (fv_provider_register, as rdma-core's libmlx5.so.1 does through
 * verbs_register_driver) and has none of the Data Direct calls. Unloading
 * it leaves libibverbs an entry into unmapped code (the fake aborts at the
 * next ibv_get_device_list, rdma-core crashes).
 */
#include "../fv.h"

static int fv_mlx5_old_probe(void)
{
	return 0;
}

__attribute__((constructor)) static void fv_mlx5_old_register(void)
{
	fv_provider_register("mlx5 (old)", fv_mlx5_old_probe);
}
