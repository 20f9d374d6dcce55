/* nccl-net-rail: names for the plugin's own threads (thread.h). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "thread.h"

void rail_thread_name(const char *fmt, ...)
{
	char name[16];	/* the kernel keeps 15 characters */
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	pthread_setname_np(pthread_self(), name);
}
