/*
 * nccl-net-rail: everything the verbs transport exchanges with its peer,
 * encoded and decoded here and nowhere else (each decoder can be fuzzed on
 * its own): the out-of-band handshake messages, the clear-to-send (CTS)
 * entries the receiver RDMA-writes into the sender's FIFO, the immediate
 * value of the completing write, and the completion records.
 *
 * Handshake frame: 16-byte header {u32 magic "RIBW", u16 version, u16 type,
 * u32 body length, u32 FNV-1a of the body} + body:
 *   u64 nonce, u8 ndevs, u8 qps_per_dev, u8 tc, u8 sl, u16 nqps, u16 flags,
 *   u64 ctrl_addr, u32 refuse_code,
 *   ndevs x {u16 lid, u8 port, u8 link_layer, u8 mtu, u8 gid_index, u16 0,
 *            u32 ctrl_rkey, u8 gid[16]},
 *   nqps x u32 qpn, u8 text_len, text.
 *
 * CTS entry, 64 bytes: u64 addr, u64 size, u32 rkey[8] (one per receiver
 * member device), i32 tag, u8 nreqs, u8 idx, u16 0, u64 seq (written last;
 * seq = receive number + 1 marks the entry valid).
 */
#ifndef RAIL_IB_WIRE_H
#define RAIL_IB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define RAIL_IB_WIRE_MAGIC 0x57424952u /* "RIBW" */
#define RAIL_IB_WIRE_VERSION 1
#define RAIL_IB_HDR_SIZE 16
#define RAIL_IB_BODY_MAX 1024
#define RAIL_IB_WIRE_MAX_QPS 128
#define RAIL_IB_CTS_SIZE 64
#define RAIL_IB_REFUSE_TEXT 120

enum rail_ib_msg_type {
	RAIL_IB_MSG_HELLO = 1,	/* sender -> receiver: nonce, devices, QPs per device */
	RAIL_IB_MSG_ACCEPT = 2,	/* receiver -> sender: devices, QPNs, completion records */
	RAIL_IB_MSG_READY = 3,	/* sender -> receiver: QPNs, CTS FIFO */
	RAIL_IB_MSG_REFUSE = 4,	/* receiver -> sender: why the connection is refused */
};

enum rail_ib_refuse_code {
	RAIL_IB_REFUSE_NONCE = 1,
	RAIL_IB_REFUSE_LINK_LAYER = 2,
	RAIL_IB_REFUSE_RESOURCES = 3,
};

struct rail_ib_wire_dev {
	uint16_t lid;
	uint8_t port;
	uint8_t link_layer;
	uint8_t mtu;		/* enum ibv_mtu */
	uint8_t gid_index;
	uint32_t ctrl_rkey;
	uint8_t gid[16];
};

struct rail_ib_msg {
	int type;
	uint64_t nonce;
	int ndevs;
	int qps_per_dev;
	int tc, sl;
	int nqps;
	int flags;
	uint64_t ctrl_addr;
	uint32_t refuse_code;
	struct rail_ib_wire_dev devs[RAIL_MAX_VDEV_DEVS];
	uint32_t qpn[RAIL_IB_WIRE_MAX_QPS];
	char text[RAIL_IB_REFUSE_TEXT + 1];
};

/* Encode into buf (RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX); returns the length or -EINVAL. */
int rail_ib_msg_encode(const struct rail_ib_msg *m, uint8_t *buf, size_t len);
/* Header only: the body length, or -EPROTO/-EPROTONOSUPPORT/-EBADMSG with why. */
int rail_ib_msg_header(const uint8_t *hdr, int *type, char *why, size_t why_len);
/* Header + body; 0 or -EBADMSG (why says which field). */
int rail_ib_msg_decode(const uint8_t *buf, size_t len, struct rail_ib_msg *m, char *why,
		       size_t why_len);

struct rail_ib_cts {
	uint64_t addr;
	uint64_t size;
	uint32_t rkey[RAIL_MAX_VDEV_DEVS];
	int32_t tag;
	int nreqs;
	int idx;
	uint64_t seq;
};

void rail_ib_cts_encode(const struct rail_ib_cts *c, uint8_t *p);
/* The seq field, read atomically (the NIC may be writing the entry). */
uint64_t rail_ib_cts_seq(const uint8_t *p);
/*
 * Decode an entry whose seq is expected: -EAGAIN if not there yet, -EBADMSG
 * (why) when present but malformed (nreqs, idx).
 */
int rail_ib_cts_decode(const uint8_t *p, uint64_t expect_seq, int expect_idx,
		       struct rail_ib_cts *c, char *why, size_t why_len);

/*
 * Immediate data of the completing write: a size (one receive), a count
 * (grouped receive: the sizes are in the completion record), or a refusal
 * (the sender's message does not fit buffer idx; size saturates at 2^27-1).
 */
#define RAIL_IB_IMM_MULTI 0x80000000u
#define RAIL_IB_IMM_REFUSED 0xc0000000u
#define RAIL_IB_IMM_REFUSED_SIZE_MAX ((1u << 27) - 1)
enum rail_ib_imm_kind {
	RAIL_IB_IMM_SIZE = 0,
	RAIL_IB_IMM_COUNT = 1,
	RAIL_IB_IMM_REFUSAL = 2,
};
uint32_t rail_ib_imm_single(size_t size);
uint32_t rail_ib_imm_multi(int nreqs);
uint32_t rail_ib_imm_refused(int idx, size_t size);
/* The kind, with *value (size or count) and *idx; -EBADMSG for a value no sender produces. */
int rail_ib_imm_decode(uint32_t imm, uint64_t *value, int *idx);

/* Completion record: nreqs x u32 received sizes. */
void rail_ib_sizes_encode(const size_t *sizes, int n, uint8_t *p);
void rail_ib_sizes_decode(const uint8_t *p, int n, size_t *sizes);

#endif
