/*
 * nccl-net-rail: the state of the TCP transport's interfaces, as the link
 * watch sees it (tcp_rescue.c writes it), kept in the lowest layer so that
 * every file may read it: a generation bumped at every change, and per
 * interface whether it is down and since when it has been running. A comm
 * compares the generation with its own at each call (tcp_move_due, one
 * load), and the move reads the rest.
 */
#include "rail.h"
#include "tcp/tcp.h"

static _Atomic int link_down[TCP_MAX_DEVS];
static _Atomic uint64_t link_up_since[TCP_MAX_DEVS];	/* when it last started running */
static _Atomic uint32_t link_gen;

uint32_t tcp_link_gen(void)
{
	return atomic_load_explicit(&link_gen, memory_order_relaxed);
}

int tcp_link_down(int dev)
{
	return dev >= 0 && dev < TCP_MAX_DEVS && atomic_load(&link_down[dev]);
}

uint64_t tcp_link_up_since(int dev)
{
	if (dev < 0 || dev >= TCP_MAX_DEVS || atomic_load(&link_down[dev]))
		return 0;
	return atomic_load(&link_up_since[dev]);
}

void tcp_link_reset(int dev)
{
	atomic_store(&link_down[dev], 0);
	atomic_store(&link_up_since[dev], rail_now_ns());
}

int tcp_link_set(int dev, int running)
{
	if (atomic_load(&link_down[dev]) == !running)
		return 0;
	if (running)
		atomic_store(&link_up_since[dev], rail_now_ns());
	atomic_store(&link_down[dev], !running);
	atomic_fetch_add(&link_gen, 1);
	return 1;
}
