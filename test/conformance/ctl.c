/*
 * Conformance suite: the control channel between role A and role B, a
 * SOCK_SEQPACKET socketpair (one message per send), or across two hosts a
 * TCP connection (--ctl-listen/--ctl-connect: a header with the length,
 * then the body). It carries handles, barriers and small values; NCCL's
 * bootstrap plays this part in real life.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "conf.h"

#define CTL_MAX 16384

struct ctl_hdr {
	uint32_t type;
	uint32_t len;
};

static const char *msg_name(int type)
{
	switch (type) {
	case RAIL_CONF_MSG_HANDLE: return "HANDLE";
	case RAIL_CONF_MSG_BARRIER: return "BARRIER";
	case RAIL_CONF_MSG_INT: return "INT";
	case RAIL_CONF_MSG_DONE: return "DONE";
	case RAIL_CONF_MSG_PID: return "PID";
	case RAIL_CONF_MSG_BLOB: return "BLOB";
	default: return "?";
	}
}

/* The whole message in one send; on a stream socket, until all of it is written. */
static ssize_t ctl_write(int fd, const uint8_t *msg, size_t len)
{
	size_t off = 0;

	while (off < len) {
		ssize_t n = send(fd, msg + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return off ? (ssize_t)off : n;
		off += (size_t)n;
	}
	return (ssize_t)off;
}

void rail_conf_ctl_send(struct rail_conf *cx, int type, const void *buf, size_t len)
{
	uint8_t msg[CTL_MAX];
	struct ctl_hdr h = { .type = (uint32_t)type, .len = (uint32_t)len };
	ssize_t n;

	RAIL_CONF_CHECK(cx, len + sizeof(h) <= sizeof(msg), "control message too large (%zu)",
			len);
	memcpy(msg, &h, sizeof(h));
	if (len)
		memcpy(msg + sizeof(h), buf, len);
	n = ctl_write(cx->ctl, msg, sizeof(h) + len);
	RAIL_CONF_CHECK(cx, n == (ssize_t)(sizeof(h) + len),
			"control channel: sending %s failed (%s): the peer role is gone",
			msg_name(type), n < 0 ? strerror(errno) : "short write");
}

/* Wait for a message to be readable; 0 on timeout (ms >= 0). */
static int ctl_wait(struct rail_conf *cx, int ms)
{
	struct pollfd pfd = { .fd = cx->ctl, .events = POLLIN };
	int r;

	do {
		r = poll(&pfd, 1, ms);
	} while (r < 0 && errno == EINTR);
	return r > 0;
}

/*
 * One message from a stream socket: len bytes, waiting at most until the
 * deadline (a peer host that vanished mid-message never sends the rest).
 * Returns the bytes read (fewer at EOF), or -1 with errno.
 */
static ssize_t ctl_read_full(struct rail_conf *cx, uint8_t *p, size_t len, int flags)
{
	size_t off = 0;

	while (off < len) {
		uint64_t now = rail_conf_now_ns();
		ssize_t n;

		if (now >= cx->deadline_ns) {
			errno = ETIMEDOUT;
			return -1;
		}
		if (!ctl_wait(cx, (int)((cx->deadline_ns - now) / 1000000) + 1))
			continue;
		n = recv(cx->ctl, p + off, len - off, flags);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -1 : (ssize_t)off;
		off += (size_t)n;
	}
	return (ssize_t)off;
}

/* ctl_take on a stream socket: the header (peeked or read), then the body. */
static size_t ctl_take_stream(struct rail_conf *cx, int type, void *buf, size_t len,
			      int peek_only, int *got_type)
{
	struct ctl_hdr h;
	ssize_t n;

	/* MSG_PEEK returns what is queued: wait until the whole header is. */
	for (int tries = 0;; tries++) {
		n = recv(cx->ctl, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
		if (n == (ssize_t)sizeof(h) || n == 0 || (n < 0 && errno != EAGAIN &&
							   errno != EINTR))
			break;
		RAIL_CONF_CHECK(cx, !rail_conf_expired(cx), "control channel: half a header "
				"from the peer host, then nothing");
		rail_conf_sleep_ms(tries < 10 ? 0 : 1);
	}
	if (n == 0)
		rail_conf_fail(cx, "the peer role exited (control connection closed) while this "
			       "role waited for %s", msg_name(type));
	RAIL_CONF_CHECK(cx, n == (ssize_t)sizeof(h), "control channel: %s",
			n < 0 ? strerror(errno) : "short header");
	*got_type = (int)h.type;
	if ((int)h.type != type) {
		if (peek_only)
			return 0;
		rail_conf_fail(cx, "control channel out of step: expected %s, the peer sent %s",
			       msg_name(type), msg_name((int)h.type));
	}
	RAIL_CONF_CHECK(cx, h.len <= len && h.len <= CTL_MAX,
			"control channel: %s of %u bytes, room for %zu", msg_name(type), h.len, len);
	n = ctl_read_full(cx, (uint8_t *)&h, sizeof(h), 0);
	RAIL_CONF_CHECK(cx, n == (ssize_t)sizeof(h), "control channel: header lost");
	if (h.len) {
		n = ctl_read_full(cx, buf, h.len, 0);
		RAIL_CONF_CHECK(cx, n == (ssize_t)h.len, "control channel: %s body: %s",
				msg_name(type), n < 0 ? strerror(errno) : "the peer closed mid-message");
	}
	return h.len;
}

static size_t ctl_take(struct rail_conf *cx, int type, void *buf, size_t len, int peek_only,
		       int *got_type)
{
	uint8_t msg[CTL_MAX];
	struct ctl_hdr h;
	ssize_t n;

	if (cx->ctl_stream)
		return ctl_take_stream(cx, type, buf, len, peek_only, got_type);
	do {
		n = recv(cx->ctl, msg, sizeof(msg), peek_only ? MSG_PEEK : 0);
	} while (n < 0 && errno == EINTR);
	if (n == 0)
		rail_conf_fail(cx, "the peer role exited while this role waited for %s",
			       msg_name(type));
	RAIL_CONF_CHECK(cx, n >= (ssize_t)sizeof(h), "control channel: bad message (%s)",
			n < 0 ? strerror(errno) : "short");
	memcpy(&h, msg, sizeof(h));
	*got_type = (int)h.type;
	if ((int)h.type != type) {
		if (peek_only)
			return 0;
		rail_conf_fail(cx, "control channel out of step: expected %s, the peer sent %s",
			       msg_name(type), msg_name((int)h.type));
	}
	if (peek_only) {
		do {
			n = recv(cx->ctl, msg, sizeof(msg), 0);
		} while (n < 0 && errno == EINTR);
	}
	RAIL_CONF_CHECK(cx, h.len <= len && (size_t)n == sizeof(h) + h.len,
			"control channel: %s of %u bytes, room for %zu", msg_name(type), h.len, len);
	if (h.len)
		memcpy(buf, msg + sizeof(h), h.len);
	return h.len;
}

size_t rail_conf_ctl_recv(struct rail_conf *cx, int type, void *buf, size_t len)
{
	int got;

	for (;;) {
		uint64_t now = rail_conf_now_ns();

		if (now >= cx->deadline_ns)
			rail_conf_fail(cx, "timed out waiting for the peer role's %s", msg_name(type));
		if (ctl_wait(cx, (int)((cx->deadline_ns - now) / 1000000) + 1))
			return ctl_take(cx, type, buf, len, 0, &got);
	}
}

int rail_conf_ctl_poll(struct rail_conf *cx, int type, void *buf, size_t len)
{
	int got = 0;

	if (!ctl_wait(cx, 0))
		return 0;
	ctl_take(cx, type, buf, len, 1, &got);
	return got == type;
}

void rail_conf_barrier(struct rail_conf *cx, const char *name)
{
	char got[128] = "";
	size_t n;

	rail_conf_stage(cx, "barrier %s", name);
	rail_conf_ctl_send(cx, RAIL_CONF_MSG_BARRIER, name, strlen(name));
	n = rail_conf_ctl_recv(cx, RAIL_CONF_MSG_BARRIER, got, sizeof(got) - 1);
	got[n] = 0;
	RAIL_CONF_CHECK(cx, !strcmp(got, name), "barrier out of step: at %s, the peer at %s", name,
			got);
}

int64_t rail_conf_xchg(struct rail_conf *cx, int64_t mine)
{
	int64_t theirs = 0;

	rail_conf_ctl_send(cx, RAIL_CONF_MSG_INT, &mine, sizeof(mine));
	rail_conf_ctl_recv(cx, RAIL_CONF_MSG_INT, &theirs, sizeof(theirs));
	return theirs;
}
