/*
 * nccl-net-rail: small helpers shared by every part of the core.
 * Convention: functions return 0 or a negative errno; they set outputs
 * only on success.
 */
#ifndef RAIL_RAIL_H
#define RAIL_RAIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The one version number (file VERSION at the top of the tree): the .so, the
 * tools' --version, the init log line and the packages all use it. The
 * Makefile passes it in; a build by other means must pass it too.
 */
#ifndef RAIL_VERSION
#error "RAIL_VERSION is not defined: build with make (it reads the file VERSION)"
#endif
#define RAIL_VERSION_STRING RAIL_VERSION

#define RAIL_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* 1 in a ThreadSanitizer build (gcc defines __SANITIZE_THREAD__, clang has the feature). */
#if defined(__SANITIZE_THREAD__)
#define RAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RAIL_TSAN 1
#endif
#endif
#ifndef RAIL_TSAN
#define RAIL_TSAN 0
#endif
#define RAIL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define RAIL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define RAIL_DIV_UP(x, y) (((x) + (y)-1) / (y))
#define RAIL_ALIGN_UP(x, a) (RAIL_DIV_UP((x), (a)) * (a))

#define rail_likely(x) __builtin_expect(!!(x), 1)
#define rail_unlikely(x) __builtin_expect(!!(x), 0)

/* Public entry points (the ncclNetPlugin_vN tables, tool mains) only. */
#define RAIL_EXPORT __attribute__((visibility("default")))

/*
 * Not a system errno: end of file, the peer closed its end of the connection
 * (which ECONNRESET, "Connection reset by peer", would misreport). rail_strerror
 * says so; rail_result maps it to ncclRemoteError.
 */
#define RAIL_ECLOSED 4095

/* A thread-safe strerror for negative errno values (and RAIL_ECLOSED). */
const char *rail_strerror(int neg_errno, char *buf, size_t len);
#define RAIL_ERRSTR(err) rail_strerror((err), (char[96]){0}, 96)

/* Monotonic clock in nanoseconds. */
uint64_t rail_now_ns(void);
/*
 * CLOCK_MONOTONIC_COARSE: the same clock at the last timer tick (1-4 ms
 * steps), read without the time counter; for times kept for people (the
 * flight record), not for latencies.
 */
uint64_t rail_coarse_ns(void);

/* 64 random bits from getrandom(), falling back to the clock and pid. */
uint64_t rail_random64(void);

/*
 * len bytes from the kernel's random source (getrandom(2), waiting for it to
 * be seeded, never falling back to anything weaker): for keys. 0 or -errno.
 */
int rail_random_bytes(void *buf, size_t len);

/* Copy a string into a fixed buffer, always terminated. */
void rail_strlcpy(char *dst, const char *src, size_t size);

#endif
