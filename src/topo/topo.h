/*
 * nccl-net-rail: the sysfs topology model and the per-GPU NIC choice.
 *
 * Everything is read through src/sysfs.h, relative to one root, so a copy of
 * sysfs (test/fixtures/<server>, a rail-info --snapshot) gives the same
 * answer as the machine it came from. The model holds:
 *   - GPUs: NVIDIA PCI functions of class 0x0300xx/0x0302xx, plus any
 *     accelerator given by PCI address;
 *   - NICs: every RDMA device in /sys/class/infiniband with its ports
 *     (state, link layer, rate, netdev), PCI function, NUMA node and whether
 *     it is an SR-IOV virtual function (a separate rail of its own);
 *   - netdevs: /sys/class/net with their PCI function and RDMA port;
 *   - the GPU x NIC distance matrix in nvidia-smi's terms (PIX ... SYS);
 *   - for every GPU the NICs (device + port) to use, best first, with the
 *     locality the choice came from and a reason an operator can read.
 *
 * Choice rules (src/topo/topo_choice.c):
 *   1. Only ACTIVE ports of RDMA devices selected by NCCL_IB_HCA count.
 *   2. The nearest relation wins; among equally near ports the fastest rate.
 *   3. GPUs with the same nearest set (a "group", e.g. two GPUs behind one
 *      switch) share it out deterministically: GPU j of g (by BDF) gets the
 *      candidates j, j+g, j+2g, ... (sorted by BDF, port); when there are
 *      fewer candidates than GPUs, candidate j mod k.
 *   4. Locality "pcie" when the PCIe tree decided (PIX, PXB, or PHB that
 *      some other NIC does not have), "numa" when only the NUMA node matched
 *      (NODE), "none" when nothing distinguishes the NICs (a flat VM tree,
 *      NUMA -1, or only SYS NICs): then rule 3 spreads GPU i to NIC i mod n.
 *   5. NCCL_RAIL_GPU_NIC_MAP, when valid, replaces the choice for the GPUs
 *      it names (format below).
 *
 * NCCL_RAIL_GPU_NIC_MAP format:
 *   entry[;entry...]      entries separated by ';' (or ',')
 *   entry := gpu=nic[+nic...]
 *   gpu   := PCI address "0000:1b:00.0" (or "1b:00.0" in domain 0), or a
 *            GPU index: the position in PCI address order (nvidia-smi order)
 *   nic   := RDMA device [":" port] ("mlx5_0:1", "mlx5_2" = its active
 *            ports), or a netdev name ("ib0")
 *   e.g.  0000:1b:00.0=mlx5_0:1+mlx5_1:1;0000:3d:00.0=mlx5_2
 *         0=mlx5_ib0,1=mlx5_ib1
 * A malformed map, or one naming an unknown NIC, is warned (naming the
 * variable) and ignored as a whole; entries for GPUs this host does not
 * have are skipped (a map can be written once for a whole cluster); a
 * mapped port that is not ACTIVE is dropped with a warning.
 *
 * All functions return 0 or a negative errno and set outputs only on
 * success. A model is immutable once built and may be read from any thread.
 */
#ifndef RAIL_TOPO_H
#define RAIL_TOPO_H

#include <stddef.h>
#include <stdio.h>

#define RAIL_TOPO_BDF_LEN 24	 /* "0000:1b:00.0"; VMD domains have 5 digits */
#define RAIL_TOPO_NAME_LEN 64
#define RAIL_TOPO_PATH_LEN 512
#define RAIL_TOPO_MAX_PORTS 4
#define RAIL_TOPO_MAX_PICKS 8	 /* NICs chosen for one GPU */
#define RAIL_TOPO_REASON_LEN 256

/* Distances, nvidia-smi's names, nearest first. */
enum rail_topo_rel {
	RAIL_TOPO_PIX = 0, /* same PCIe switch, or at most one bridge */
	RAIL_TOPO_PXB = 1, /* several switches, below one root port */
	RAIL_TOPO_PHB = 2, /* through one host bridge (root complex) */
	RAIL_TOPO_NODE = 3, /* different host bridges, same NUMA node */
	RAIL_TOPO_SYS = 4, /* across NUMA nodes, or unknown */
};

enum rail_topo_locality {
	RAIL_TOPO_LOC_PCIE = 0, /* the PCIe tree decided */
	RAIL_TOPO_LOC_NUMA = 1, /* only the NUMA node matched */
	RAIL_TOPO_LOC_NONE = 2, /* nothing distinguished the NICs */
};

#define RAIL_TOPO_PORT_ACTIVE 4 /* ports/<p>/state "4: ACTIVE" */

struct rail_topo_port {
	int port;		/* 1-based, as in sysfs */
	int state;		/* 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE; 0 unknown */
	int phys_state;		/* 5 LinkUp; 0 unknown */
	int rate_mbps;		/* from ports/<p>/rate; 0 unknown */
	char link_layer[16];	/* "InfiniBand", "Ethernet", "" */
	char netdev[RAIL_TOPO_NAME_LEN]; /* "" when none */
	int usable;		/* ACTIVE and selected by NCCL_IB_HCA */
	char why_not[96];	/* why not usable */
};

struct rail_topo_nic {
	char name[RAIL_TOPO_NAME_LEN];	 /* "mlx5_0" */
	char bdf[RAIL_TOPO_BDF_LEN];	 /* "" when not a PCI device (rxe) */
	char pci_path[RAIL_TOPO_PATH_LEN]; /* "/sys/devices/pci0000:15/.../0000:18:00.0" */
	int numa;			 /* -1: unknown */
	int is_vf;			 /* SR-IOV virtual function */
	char pf_bdf[RAIL_TOPO_BDF_LEN];	 /* its physical function */
	unsigned vendor, device;
	int nports;
	struct rail_topo_port ports[RAIL_TOPO_MAX_PORTS];
};

struct rail_topo_gpu {
	char bdf[RAIL_TOPO_BDF_LEN];
	char pci_path[RAIL_TOPO_PATH_LEN];
	int numa;
	int nvidia;		/* 0: given with --gpus / extra_gpus */
	unsigned vendor, device, pci_class;
};

struct rail_topo_netdev {
	char name[RAIL_TOPO_NAME_LEN];
	char bdf[RAIL_TOPO_BDF_LEN];	/* "" when not on PCI (virtual, VMBus) */
	char pci_path[RAIL_TOPO_PATH_LEN];
	int numa;
	char ibdev[RAIL_TOPO_NAME_LEN]; /* RDMA device of this netdev, "" if none */
	int ibport;
	int speed_mbps;			/* -1 unknown */
	char operstate[16];
};

/* One chosen NIC port. */
struct rail_topo_pick {
	int nic;		/* index into nics */
	int port_idx;		/* index into nics[nic].ports */
	enum rail_topo_rel rel;
};

struct rail_topo_choice {
	enum rail_topo_locality locality;
	int from_map;		/* NCCL_RAIL_GPU_NIC_MAP decided */
	int npicks;		/* 0: no usable NIC */
	struct rail_topo_pick picks[RAIL_TOPO_MAX_PICKS];
	char reason[RAIL_TOPO_REASON_LEN];
	/*
	 * Where this GPU's connections would go when its first choice fails
	 * (topo_fallback.c has the rules): the nearest, then another card
	 * among equally near ones, then the least used; none when no other
	 * usable port of the same link layer exists.
	 */
	int has_fallback;
	struct rail_topo_pick fallback;
	char fallback_reason[RAIL_TOPO_REASON_LEN];
};

struct rail_topo {
	int ngpus, nnics, nnetdevs;
	struct rail_topo_gpu *gpus;	  /* sorted by BDF */
	struct rail_topo_nic *nics;	  /* sorted by name */
	struct rail_topo_netdev *netdevs; /* sorted by name */
	int nnuma;			  /* NUMA nodes in sysfs (0: unknown) */
	enum rail_topo_rel *rel;	  /* ngpus x nnics, rel[g * nnics + n] */
	struct rail_topo_choice *choice;  /* one per GPU */
	int map_set;			  /* NCCL_RAIL_GPU_NIC_MAP given */
	int map_used;			  /* ... and valid */
	char map_status[RAIL_TOPO_REASON_LEN]; /* why not used, or "" */
	int nwarn;
	char (*warn)[RAIL_TOPO_REASON_LEN]; /* advice with remedies */
};

/*
 * Build the model from the current sysfs root. extra_gpus: NULL, or a
 * comma list of PCI addresses of accelerators that are not NVIDIA GPUs.
 * A malformed NCCL_RAIL_GPU_NIC_MAP is warned here (once per build).
 */
int rail_topo_build(const char *extra_gpus, struct rail_topo **out);
void rail_topo_free(struct rail_topo *t);

/*
 * The process-wide model, built on first use (thread-safe) with no extra
 * GPUs; NULL when it cannot be built. rail_topo_reset() drops it (tests,
 * after rail_sysfs_set_root or a parameter reload).
 */
const struct rail_topo *rail_topo_get(void);
void rail_topo_reset(void);

/* Index of the GPU with this PCI address (any case, "1b:00.0" = domain 0), or -ENOENT. */
int rail_topo_gpu_index(const struct rail_topo *t, const char *bdf);
/* The choice for a GPU by PCI address, NULL when the model has no such GPU. */
const struct rail_topo_choice *rail_topo_choice_for_gpu(const struct rail_topo *t,
							 const char *bdf);

/*
 * The process's GPU without CUDA: spec is a PCI address, a GPU index, a
 * GPU UUID ("GPU-8c1d...", looked up in /proc/driver/nvidia/gpus/ under
 * the sysfs root), or a CUDA_VISIBLE_DEVICES value naming exactly one
 * device. The plugin passes NCCL_RAIL_GPU_BDF when set, else
 * CUDA_VISIBLE_DEVICES. -ENOENT when it names no GPU of the model,
 * -EINVAL when it names several or is malformed.
 */
int rail_topo_resolve_gpu(const struct rail_topo *t, const char *spec, char *bdf, size_t len);

/*
 * v12 railId / planeId of an RDMA device port, from the process-wide
 * model: rails are numbered in order of first use when the GPUs (by PCI
 * address) and their chosen NICs (best first) are walked, so the NIC of
 * GPU i is rail i on a one-NIC-per-GPU server and NICs at the same place
 * under the GPUs share a rail across identical hosts. A port no GPU uses
 * gets rail -1. plane is -1 (no multi-plane NIC is modelled yet).
 * -ENODEV when the device/port is unknown.
 */
int rail_topo_rail_of(const char *ibdev, int port, int *rail, int *plane);
int rail_topo_rail_of_model(const struct rail_topo *t, const char *ibdev, int port, int *rail,
			    int *plane);

/*
 * Where a connection on RDMA port ibdev:port goes when that port fails, by
 * the model (topo_fallback.c's rules: GPUDirect distance, another card,
 * load, speed): the fallback of the GPU whose first choice it is, gpu (a
 * PCI address, the process's GPU) when that one's, else the first such GPU
 * by PCI address. why: which GPU and why, for a log line. -ENOENT when no
 * GPU's first choice is that port or that GPU has no fallback.
 */
int rail_topo_fallback_of(const char *ibdev, int port, const char *gpu, char *fb_ibdev,
			  size_t len, int *fb_port, char *why, size_t why_len);
int rail_topo_fallback_of_model(const struct rail_topo *t, const char *ibdev, int port,
				const char *gpu, char *fb_ibdev, size_t len, int *fb_port,
				char *why, size_t why_len);

/*
 * The real sysfs path of the PCI function behind an RDMA device or a
 * netdev ("/sys/devices/pci0000:15/0000:15:01.0/.../0000:18:00.0"), the
 * form NCCL wants in pciPath; the sysfs root is not part of it. -ENODEV
 * when it is not a PCI device.
 */
int rail_topo_pci_path(const char *ibdev, char *out, size_t len);
int rail_topo_netdev_pci_path(const char *ifname, char *out, size_t len);

/*
 * When NCCL_RAIL_GPU_NIC_MAP was used and the PCIe tree hides locality,
 * write an NCCL topology file that puts each mapped GPU and its NICs under
 * one (virtual) PCIe switch, so NCCL's own search agrees with the map.
 * dir: a directory for the file, or NULL for an anonymous memfd (the path
 * is then /proc/self/fd/N and lives as long as the process). Returns 1 and
 * the path when written, 0 when no file is needed, or -errno. The caller
 * sets NCCL_TOPO_FILE to the path only when the operator has not set it.
 */
int rail_topo_write_nccl_xml(const struct rail_topo *t, const char *dir, char *path, size_t len);
/* The same document to a stream (rail-info, tests). */
int rail_topo_print_nccl_xml(const struct rail_topo *t, FILE *out);

/* Names: "PIX", ..., "SYS"; "pcie", "numa", "none". */
const char *rail_topo_rel_name(enum rail_topo_rel rel);
const char *rail_topo_locality_name(enum rail_topo_locality loc);

/* Relation of two PCI paths (exposed for tests); numa -1 = unknown. */
enum rail_topo_rel rail_topo_relation(const char *path_a, int numa_a, const char *path_b,
				      int numa_b, int nnuma);

/* One INFO line per GPU and the advice lines, for the plugin's init log. */
void rail_topo_log(const struct rail_topo *t);
/* The choice for one GPU (the process's current one), plus the warnings. */
void rail_topo_log_gpu(const struct rail_topo *t, const char *bdf);

/*
 * rail-info: the GPU x NIC matrix, the choice per GPU with its reason,
 * the RDMA devices and the netdevs (text; sections with nothing to show
 * are left out, and the advice is not printed: rail-info lists t->warn
 * with its other problems), or one JSON object:
 *   {"sysfs_root", "numa_node_count", "gpus": [{"index", "bdf", "numa",
 *     "pci_vendor", "pci_device", "nvidia", "pci_path", "locality",
 *     "source", "reason", "nics": [{"name", "port", "relation", "netdev",
 *     "speed_mbps", "rail"}], "fallback" (one such NIC object, or null),
 *     "fallback_reason", "relations"}],
 *    "rdma_devices": [{..., "ports": [{..., "usable", "reason"}]}],
 *    "netdevs": [...], "gpu_nic_map": {"set", "used", "status"},
 *    "warnings": [...]}
 */
void rail_topo_print(const struct rail_topo *t, FILE *out, int json);
/* The members of that object but "warnings", without the braces, to embed them in another. */
void rail_topo_print_json_members(const struct rail_topo *t, FILE *out);

#endif
