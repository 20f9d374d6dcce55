/*
 * rail-check: what one process tells the others about itself (host,
 * plugin version, wire versions, the transport the plugin chose, the
 * settings that must agree, and per device its name, port, link layer,
 * GID and GID type, subnet, MTU and speed), read from the plugin's own
 * state after init, and its text form on the control connection.
 *
 * Text form: one line per item, fields separated by tabs:
 *   rail-check 1 | host H | version V | transport T | why W |
 *   wire HANDLE TCP IB | ctrl HOST PORT | rank R | conf NAME VALUE |
 *   dev NAME PORT LINK GID GID_INDEX GID_TYPE SUBNET MTU SPEED
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "ib/ib.h"
#include "param.h"
#include "rail.h"
#include "check/check.h"
#include "tcp/tcp.h"

/*
 * The settings compared between processes (docs/DEPLOY.md, "Preflight").
 * NCCL_RAIL_TRANSPORT is compared as the transport chosen.
 */
static const char *const conf_names[] = {
	"NCCL_IB_GID_INDEX", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_FAMILY",
	"NCCL_IB_ADDR_RANGE", "NCCL_IB_TC", "NCCL_IB_SL", "NCCL_IB_PKEY", "NCCL_RAIL_IB_EAGER",
	"NCCL_RAIL_IB_EAGER_ORDER", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_SPLIT_DATA_ON_QPS",
	"NCCL_IB_ECE_ENABLE", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_IB_ADAPTIVE_ROUTING",
	"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_RAIL_TCP_INLINE",
	"NCCL_RAIL_TCP_MIN_CHUNK", "NCCL_RAIL_PEER_TIMEOUT",
};

static void conf_local(struct rail_ck_info *me)
{
	me->nconf = 0;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(conf_names) && me->nconf < RAIL_CK_MAX_CONF; i++) {
		for (int p = 0; p < RAIL_P_COUNT; p++) {
			struct rail_ck_conf *c = &me->conf[me->nconf];

			if (strcmp(rail_param_table[p].name, conf_names[i]))
				continue;
			rail_strlcpy(c->name, conf_names[i], sizeof(c->name));
			rail_param_value_text((enum rail_param_id)p, c->value, sizeof(c->value));
			me->nconf++;
			break;
		}
	}
}

const char *rail_ck_conf_get(const struct rail_ck_info *in, const char *name)
{
	for (int i = 0; i < in->nconf; i++)
		if (!strcmp(in->conf[i].name, name))
			return in->conf[i].value;
	return NULL;
}

/* "a.b.c.0/24" for addr (AF_INET or AF_INET6 bytes) from this host's interfaces; "" if absent. */
static void subnet_of(int family, const void *addr, const char *ifname, char *out, size_t len)
{
	struct ifaddrs *ifa, *i;
	size_t alen = family == AF_INET ? 4 : 16;

	out[0] = '\0';
	if (getifaddrs(&ifa))
		return;
	for (i = ifa; i; i = i->ifa_next) {
		const unsigned char *a, *m;
		unsigned char net[16];
		char txt[INET6_ADDRSTRLEN];
		int bits = 0;

		if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != family)
			continue;
		if (ifname && strcmp(i->ifa_name, ifname))
			continue;
		a = family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
				      : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
		m = family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_netmask)->sin_addr
				      : (const void *)&((struct sockaddr_in6 *)i->ifa_netmask)->sin6_addr;
		if (memcmp(a, addr, alen))
			continue;
		for (size_t k = 0; k < alen; k++) {
			net[k] = a[k] & m[k];
			bits += __builtin_popcount(m[k]);
		}
		if (inet_ntop(family, net, txt, sizeof(txt)))
			snprintf(out, len, "%s/%d", txt, bits);
		break;
	}
	freeifaddrs(ifa);
}

static void dev_ib(int d, struct rail_ck_dev *o)
{
	struct rail_ib_dev *dev = rail_ib_dev_get(d);
	struct rail_ib_gid_choice g;
	static const uint8_t v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	if (!dev)
		return;	/* a fused device: its members are listed */
	o->port = dev->port;
	o->mtu = rail_ib_mtu_bytes(dev->mtu);
	rail_strlcpy(o->link, rail_link_layer_str(dev->link_layer), sizeof(o->link));
	if (rail_ib_dev_gid_resolve(dev, &g) || g.index < 0) {
		snprintf(o->gid, sizeof(o->gid), "none");
		rail_strlcpy(o->gid_type, "none", sizeof(o->gid_type));
		return;
	}
	o->gid_index = g.index;
	rail_ib_gid_str(g.raw, o->gid, sizeof(o->gid));
	if (dev->link_layer != IBV_LINK_LAYER_ETHERNET) {
		rail_strlcpy(o->gid_type, "IB", sizeof(o->gid_type));
		snprintf(o->subnet, sizeof(o->subnet), "%02x%02x:%02x%02x:%02x%02x:%02x%02x::/64",
			 g.raw[0], g.raw[1], g.raw[2], g.raw[3], g.raw[4], g.raw[5], g.raw[6],
			 g.raw[7]);
		return;
	}
	snprintf(o->gid_type, sizeof(o->gid_type), "RoCEv%d", g.roce_version);
	if (!memcmp(g.raw, v4mapped, sizeof(v4mapped)))
		subnet_of(AF_INET, g.raw + 12, NULL, o->subnet, sizeof(o->subnet));
	else
		subnet_of(AF_INET6, g.raw, NULL, o->subnet, sizeof(o->subnet));
}

static void dev_tcp(int d, struct rail_ck_dev *o)
{
	const struct tcp_dev *t = tcp_dev_get(d);
	const union rail_sockaddr *a;
	char path[128], buf[32];
	FILE *f;

	if (!t)
		return;
	a = &t->addr;
	rail_strlcpy(o->link, "Ethernet", sizeof(o->link));
	rail_strlcpy(o->gid_type, "IP", sizeof(o->gid_type));
	if (a->sa.sa_family == AF_INET) {
		inet_ntop(AF_INET, &a->sin.sin_addr, o->gid, sizeof(o->gid));
		subnet_of(AF_INET, &a->sin.sin_addr, t->name, o->subnet, sizeof(o->subnet));
	} else {
		inet_ntop(AF_INET6, &a->sin6.sin6_addr, o->gid, sizeof(o->gid));
		subnet_of(AF_INET6, &a->sin6.sin6_addr, t->name, o->subnet, sizeof(o->subnet));
	}
	snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", t->name);
	f = fopen(path, "r");
	if (f) {
		if (fgets(buf, sizeof(buf), f))
			o->mtu = atoi(buf);
		fclose(f);
	}
}

void rail_ck_info_local(struct rail_ck_info *me, int init_ok, const char *init_why)
{
	char devs[64];
	const char *name = "";
	int n = 0;

	if (gethostname(me->host, sizeof(me->host)))
		rail_strlcpy(me->host, "?", sizeof(me->host));
	me->host[sizeof(me->host) - 1] = '\0';
	rail_strlcpy(me->version, RAIL_VERSION_STRING, sizeof(me->version));
	me->wire_handle = RAIL_HANDLE_VERSION;
	me->wire_tcp = TCP_WIRE_VERSION;
	me->wire_ib = RAIL_IB_WIRE_VERSION;
	conf_local(me);
	me->ndev = 0;
	if (!init_ok || rail_net_transport_info(&name, me->why, sizeof(me->why), devs, sizeof(devs))) {
		me->transport[0] = '\0';
		rail_strlcpy(me->why, init_why, sizeof(me->why));
		return;
	}
	rail_strlcpy(me->transport, name, sizeof(me->transport));
	if (rail_net_devices(&n) != ncclSuccess)
		n = 0;
	for (int d = 0; d < n && me->ndev < RAIL_CK_MAX_DEVS; d++) {
		struct rail_ck_dev *o = &me->dev[me->ndev++];
		struct rail_props p;

		memset(o, 0, sizeof(*o));
		o->gid_index = -1;
		rail_strlcpy(o->gid, "-", sizeof(o->gid));
		rail_strlcpy(o->gid_type, "-", sizeof(o->gid_type));
		if (rail_net_get_properties(d, &p) == ncclSuccess) {
			rail_strlcpy(o->name, p.name, sizeof(o->name));
			o->speed = p.speed;
		}
		if (!strcmp(name, "ib"))
			dev_ib(d, o);
		else
			dev_tcp(d, o);
	}
}

/* ---- text form ----------------------------------------------------------- */

/* Tabs and newlines would break the fields: replace them. */
static const char *clean(const char *s, char *buf, size_t len)
{
	size_t i = 0;

	for (; s[i] && i + 1 < len; i++)
		buf[i] = s[i] == '\t' || s[i] == '\n' || s[i] == '\r' ? ' ' : s[i];
	buf[i] = '\0';
	if (!buf[0])
		rail_strlcpy(buf, "-", len);
	return buf;
}

#define C(s) clean((s), (char[RAIL_CK_WHY]){0}, RAIL_CK_WHY)

int rail_ck_info_encode(const struct rail_ck_info *in, char *buf, size_t len)
{
	size_t off = 0;
	int n;

#define OUT(...)                                                                \
	do {                                                                    \
		n = snprintf(buf + off, off < len ? len - off : 0, __VA_ARGS__); \
		off += (size_t)n;                                               \
	} while (0)
	OUT("rail-check\t1\nrank\t%d\t%d\nhost\t%s\nversion\t%s\ntransport\t%s\nwhy\t%s\n",
	    in->rank, in->want_rank, C(in->host), C(in->version), C(in->transport), C(in->why));
	OUT("wire\t%d\t%d\t%d\nctrl\t%s\t%d\n", in->wire_handle, in->wire_tcp, in->wire_ib,
	    C(in->ctrl_host), in->ctrl_port);
	for (int i = 0; i < in->nconf; i++)
		OUT("conf\t%s\t%s\n", C(in->conf[i].name), C(in->conf[i].value));
	for (int i = 0; i < in->ndev; i++) {
		const struct rail_ck_dev *d = &in->dev[i];

		OUT("dev\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%d\t%d\n", C(d->name), d->port, C(d->link),
		    C(d->gid), d->gid_index, C(d->gid_type), C(d->subnet), d->mtu, d->speed);
	}
#undef OUT
	return off < len ? (int)off : -1;
}

/* Split line into at most max tab-separated fields (in place); returns the count. */
static int split(char *line, char **f, int max)
{
	int n = 0;
	char *save = NULL;

	for (char *t = strtok_r(line, "\t", &save); t && n < max; t = strtok_r(NULL, "\t", &save))
		f[n++] = t;
	return n;
}

/* A peer's text: "-" is empty; control bytes become '?' (the report goes to a terminal). */
static void field(char *dst, size_t len, const char *src)
{
	size_t i = 0;

	if (!strcmp(src, "-"))
		src = "";
	for (; src[i] && i + 1 < len; i++)
		dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
	dst[i] = '\0';
}

static int decode_dev(char **f, int n, struct rail_ck_info *out)
{
	struct rail_ck_dev *d;

	if (n != 10 || out->ndev >= RAIL_CK_MAX_DEVS)
		return -1;
	d = &out->dev[out->ndev++];
	field(d->name, sizeof(d->name), f[1]);
	d->port = atoi(f[2]);
	field(d->link, sizeof(d->link), f[3]);
	field(d->gid, sizeof(d->gid), f[4]);
	d->gid_index = atoi(f[5]);
	field(d->gid_type, sizeof(d->gid_type), f[6]);
	field(d->subnet, sizeof(d->subnet), f[7]);
	d->mtu = atoi(f[8]);
	d->speed = atoi(f[9]);
	return 0;
}

static int decode_line(char **f, int n, struct rail_ck_info *out)
{
	const char *k = f[0];

	if (!strcmp(k, "rank") && n == 3)
		out->rank = atoi(f[1]), out->want_rank = atoi(f[2]);
	else if (!strcmp(k, "host") && n == 2)
		field(out->host, sizeof(out->host), f[1]);
	else if (!strcmp(k, "version") && n == 2)
		field(out->version, sizeof(out->version), f[1]);
	else if (!strcmp(k, "transport") && n == 2)
		field(out->transport, sizeof(out->transport), f[1]);
	else if (!strcmp(k, "why") && n == 2)
		field(out->why, sizeof(out->why), f[1]);
	else if (!strcmp(k, "wire") && n == 4)
		out->wire_handle = atoi(f[1]), out->wire_tcp = atoi(f[2]), out->wire_ib = atoi(f[3]);
	else if (!strcmp(k, "ctrl") && n == 3)
		field(out->ctrl_host, sizeof(out->ctrl_host), f[1]), out->ctrl_port = atoi(f[2]);
	else if (!strcmp(k, "conf") && n == 3 && out->nconf < RAIL_CK_MAX_CONF) {
		field(out->conf[out->nconf].name, sizeof(out->conf[0].name), f[1]);
		field(out->conf[out->nconf++].value, sizeof(out->conf[0].value), f[2]);
	} else if (!strcmp(k, "dev"))
		return decode_dev(f, n, out);
	else
		return -1;
	return 0;
}

int rail_ck_info_decode(const char *buf, size_t len, struct rail_ck_info *out, char *why,
			size_t why_len)
{
	char *copy = strndup(buf, len), *save = NULL, *f[12];
	int lineno = 0, rc = 0;

	if (!copy) {
		snprintf(why, why_len, "out of memory");
		return -1;
	}
	memset(out, 0, sizeof(*out));
	out->want_rank = -1;
	for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		int n = split(l, f, 12);

		if (lineno++ == 0) {
			if (n != 2 || strcmp(f[0], "rail-check") || strcmp(f[1], "1")) {
				snprintf(why, why_len, "not a rail-check peer, or another version of "
					 "its control protocol");
				rc = -1;
				break;
			}
			continue;
		}
		if (n < 1 || decode_line(f, n, out)) {
			snprintf(why, why_len, "malformed line %d of the peer's description", lineno);
			rc = -1;
			break;
		}
	}
	if (!rc && lineno == 0) {
		snprintf(why, why_len, "empty description");
		rc = -1;
	}
	free(copy);
	return rc;
}
