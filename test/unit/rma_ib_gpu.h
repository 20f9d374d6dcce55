/*
 * nccl-net-rail unit tests: test_rma_ib's GPU windows, included by
 * test_rma_ib.c (its ranks, groups and fakes): the fake CUDA driver's
 * device memory registered by DMA-BUF (an fd of the fake driver, which the
 * fake provider maps) and by address (peermem: the fake provider reaches
 * it through the driver's host view), puts with signals into it, gets
 * from it, the flush's loopback READ, and a device that can do neither.
 */
#ifndef RMA_IB_GPU_H
#define RMA_IB_GPU_H

/* ---- GPU windows (the fake CUDA driver's device memory) ------------------------ */

enum gpu_way { GPU_DMABUF = 1, GPU_PEERMEM = 2, GPU_NONE = 3 };
static enum gpu_way gpu_way;

/* Lines of the fake's log holding a, b and c (NULL: any). */
static int verbs_log_count(const char *a, const char *b, const char *c)
{
	char path[160], line[1024];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/verbs.log", tmpdir);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c));
	fclose(f);
	return n;
}

/* A GPU window of n bytes, by DMA-BUF (an fd of the fake driver) or by address. */
static ncclResult_t reg_gpu(struct rank *r, void *p, size_t n, uint64_t flags, void **mh)
{
	uint64_t off = 0;
	int fd;
	ncclResult_t res;

	if (gpu_way != GPU_DMABUF)
		return rma->regMrSym(r->coll, p, n, NCCL_PTR_CUDA, flags, mh);
	fd = fcu_dmabuf(p, &off);
	RCHECK(r, fd >= 0, "no DMA-BUF fd for %p", p);
	res = rma->regMrSymDmaBuf(r->coll, p, n, NCCL_PTR_CUDA, off, fd, flags, mh);
	close(fd);	/* NCCL closes it after the call */
	return res;
}

/* Every rank puts with a signal into every rank's GPU window, then reads them back. */
static void gpu_traffic(struct rank *r, char *gwin, uint64_t *gsig, void *gwin_mh, void *gsig_mh)
{
	struct grp *g = r->g;
	const char *hw = fcu_host(gwin);
	const uint64_t *hs = fcu_host(gsig);
	void *req[MAXR];

	for (int p = 0; p < g->h.n; p++)
		for (size_t i = 0; i < g->slot; i++)
			r->src[(size_t)p * g->slot + i] = (char)rmah_pattern(r->rank, p, i);
	for (int p = 0; p < g->h.n; p++)
		ROK(r, rma->iputSignal(r->rctx, 0, (uint64_t)p * g->slot, r->src_mh, g->slot,
				       (uint64_t)r->rank * g->slot, gwin_mh, (uint32_t)p,
				       (uint64_t)r->rank * 8, gsig_mh, 1, NCCL_NET_SIGNAL_OP_ADD,
				       true, &req[p]));
	for (int p = 0; p < g->h.n && !r->fail[0]; p++)
		ROK(r, wait_req(r, req[p]));
	for (int q = 0; q < g->h.n && !r->fail[0]; q++) {
		uint64_t until = rmah_now_ns() + wait_ns;

		while (__atomic_load_n(&hs[q], __ATOMIC_ACQUIRE) < 1 && rmah_now_ns() < until)
			sched_yield();
		RCHECK(r, hs[q] == 1, "GPU signal word of rank %d is %llu", q,
		       (unsigned long long)hs[q]);
		for (size_t i = 0; i < g->slot && !r->fail[0]; i++)
			RCHECK(r, (uint8_t)hw[(size_t)q * g->slot + i] == rmah_pattern(q, r->rank, i),
			       "GPU window: byte %zu from rank %d", i, q);
	}
	pthread_barrier_wait(&g->h.bar);
	for (int p = 0; p < g->h.n && !r->fail[0]; p++) {
		size_t wsize = (size_t)g->h.n * g->slot;

		memset(r->got, 0, wsize);
		ROK(r, rma->iget(r->rctx, 0, 0, gwin_mh, wsize, 0, r->got_mh, (uint32_t)p, &req[0]));
		ROK(r, wait_req(r, req[0]));
		for (size_t i = 0; i < wsize && !r->fail[0]; i++)
			RCHECK(r, (uint8_t)r->got[i] == rmah_pattern((int)(i / g->slot), p, i % g->slot),
			       "iget of rank %d's GPU window: byte %zu", p, i);
	}
}

/* The flush of a GPU window: one RDMA READ of it on the rank's own QP; a host window: none. */
static void gpu_flush(struct rank *r, uint64_t *gsig, void *gsig_mh)
{
	char at[64];
	void *req = (void *)1;

	snprintf(at, sizeof(at), "remote_addr=%#llx ", (unsigned long long)(uintptr_t)gsig);
	RCHECK(r, verbs_log_count("opcode=RDMA_READ", at, NULL) == 0, "a READ of %p before", gsig);
	ROK(r, rma->iflush(r->rctx, 0, gsig_mh, (uint32_t)r->rank, &req));
	RCHECK(r, req != NULL, "iflush of a GPU window: no request");
	if (req)
		ROK(r, wait_req(r, req));
	RCHECK(r, verbs_log_count("opcode=RDMA_READ", at, NULL) == 1, "no loopback READ of %p",
	       gsig);
	req = (void *)1;
	ROK(r, rma->iflush(r->rctx, 0, r->sig_mh, (uint32_t)r->rank, &req));
	RCHECK(r, req == NULL, "iflush of a host window: a request");
}

static void body_gpu(struct rank *r)
{
	struct grp *g = r->g;
	char *gwin = fcu_alloc((size_t)g->h.n * g->slot);
	uint64_t *gsig = fcu_alloc((size_t)g->h.n * 8);
	void *gwin_mh = NULL, *gsig_mh = NULL;
	ncclNetProperties_v12_t props;
	int want = gpu_way == GPU_DMABUF ? NCCL_PTR_HOST | NCCL_PTR_DMABUF
		   : gpu_way == GPU_PEERMEM ? NCCL_PTR_HOST | NCCL_PTR_CUDA : NCCL_PTR_HOST;
	ncclResult_t res;

	ROK(r, rma->getProperties(0, &props));
	RCHECK(r, props.ptrSupport == want, "ptrSupport %d, want %d", props.ptrSupport, want);
	res = reg_gpu(r, gwin, (size_t)g->h.n * g->slot, 0, &gwin_mh);
	if (gpu_way == GPU_NONE) {
		RCHECK(r, res != ncclSuccess && !gwin_mh, "a GPU window on a host-only device");
		return;
	}
	RCHECK(r, res == ncclSuccess, "GPU window: %d", res);
	ROK(r, reg_gpu(r, gsig, (size_t)g->h.n * 8,
		       NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET, &gsig_mh));
	pthread_barrier_wait(&g->h.bar);
	if (!r->fail[0])
		gpu_traffic(r, gwin, gsig, gwin_mh, gsig_mh);
	if (!r->fail[0])
		gpu_flush(r, gsig, gsig_mh);
	pthread_barrier_wait(&g->h.bar);	/* nobody reaches a window going away */
	if (gwin_mh)
		ROK(r, rma->deregMrSym(r->coll, gwin_mh));
	if (gsig_mh)
		ROK(r, rma->deregMrSym(r->coll, gsig_mh));
}

static int gpu_skip(void)
{
	if (live) {
		print_message("skipping live: GPU windows need the fake CUDA driver's device memory "
			      "and the fake provider (DMA-BUF of it, peermem); rxe has no GPU\n");
		return 1;
	}
	if (!fcu_alloc || !fcu_host || !fcu_dmabuf) {
		print_message("skipping: %s not loadable (run make tests)\n", fakecuda);
		return 1;
	}
	return 0;
}

/* Whether the fake sysfs says nvidia-peermem is loaded. */
static void set_peermem(int on)
{
	char dir[160], path[200];
	FILE *f;

	snprintf(dir, sizeof(dir), "%s/sys/module/nvidia_peermem", tmpdir);
	snprintf(path, sizeof(path), "%s/version", dir);
	if (!on) {
		unlink(path);
		return;
	}
	snprintf(path, sizeof(path), "mkdir -p '%s'", dir);
	assert_int_equal(system(path), 0);
	snprintf(path, sizeof(path), "%s/version", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("580.1\n", f);
	fclose(f);
}

/* DMA-BUF (no peermem): ibv_reg_dmabuf_mr with remote write, read and atomic, no relaxed ordering. */
static void test_gpu_dmabuf(void **state)
{
	(void)state;
	if (gpu_skip())
		skip();
	gpu_way = GPU_DMABUF;
	set_peermem(0);
	setenv("NCCL_IB_PCI_RELAXED_ORDERING", "1", 1);	/* FORCE_SO or not: never relaxed */
	run_group(roce, 3, 1, 64, body_gpu);
	unsetenv("NCCL_IB_PCI_RELAXED_ORDERING");
	/* 0xf: local write, remote write, remote read, remote atomic; nothing else */
	assert_int_equal(verbs_log_count("ibv_reg_dmabuf_mr dev=", " fd=", " access=0xf "), 6);
}

/* peermem (the device without DMA-BUF): ibv_reg_mr of the GPU address. */
static void test_gpu_peermem(void **state)
{
	int before;

	(void)state;
	if (gpu_skip())
		skip();
	gpu_way = GPU_PEERMEM;
	set_peermem(1);
	before = verbs_log_count("ibv_reg_mr dev=", " access=0xf ", NULL);
	run_group(roce_nodmabuf, 2, 1, 64, body_gpu);
	set_peermem(0);
	/* per rank: 5 host windows and 2 GPU windows, by address */
	assert_int_equal(verbs_log_count("ibv_reg_mr dev=", " access=0xf ", NULL) - before, 14);
}

/* Neither: host memory only, and a GPU window refused on every rank, by name. */
static void test_gpu_host_only(void **state)
{
	(void)state;
	if (gpu_skip())
		skip();
	gpu_way = GPU_NONE;
	set_peermem(0);
	run_group(roce_nodmabuf, 2, 1, 64, body_gpu);
	unit_assert_logged2(RAIL_LOG_WARN, "window #5", "host memory only");
}

#endif
