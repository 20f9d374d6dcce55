/* nccl-net-rail: the current CUDA device's PCI address, through libcuda if loaded. */
#include <ctype.h>
#include <dlfcn.h>
#include <string.h>

#include "gpu.h"
#include "rail.h"

typedef int (*cu_ctx_get_device_fn)(int *dev);
typedef int (*cu_device_get_pci_bus_id_fn)(char *bus, int len, int dev);

int rail_current_gpu_bdf(char *bdf, size_t len)
{
	/* RTLD_NOLOAD: never pull CUDA into a process that does not use it. */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
	cu_ctx_get_device_fn get_dev;
	cu_device_get_pci_bus_id_fn get_bus;
	char bus[32] = "";
	int dev = -1, err = -ENOENT;

	if (!h)
		return -ENOENT;
	get_dev = (cu_ctx_get_device_fn)(void (*)(void))dlsym(h, "cuCtxGetDevice");
	get_bus = (cu_device_get_pci_bus_id_fn)(void (*)(void))dlsym(h, "cuDeviceGetPCIBusId");
	if (get_dev && get_bus && get_dev(&dev) == 0 && get_bus(bus, sizeof(bus), dev) == 0 &&
	    strlen(bus) < len) {
		for (size_t i = 0; bus[i]; i++)
			bdf[i] = (char)tolower((unsigned char)bus[i]);
		bdf[strlen(bus)] = '\0';
		err = 0;
	}
	dlclose(h);
	return err;
}
