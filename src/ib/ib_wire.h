/*
 * nccl-net-rail: everything the verbs transport exchanges with its peer,
 * encoded and decoded here and nowhere else (each decoder can be fuzzed on
 * its own): the out-of-band handshake messages, the clear-to-send (CTS)
 * entries the receiver RDMA-writes into the sender's FIFO, the immediate
 * value of the completing write, the completion records, and the eager
 * path's words: the trailer of an eager message, the sender's want word
 * and the receiver's credit word. The protocol itself: ib_send.c.
 *
 * Handshake frame: 16-byte header {u32 magic "RIBW", u16 version, u16 type,
 * u32 body length, u32 FNV-1a of the body} + body:
 *   u64 nonce, u8 ndevs, u8 qps_per_dev, u8 tc, u8 sl, u16 nqps, u16 flags,
 *   u64 ctrl_addr, u32 refuse_code,
 *   u64 eager_addr, u64 aux_addr, u32 eager_slot_bytes, u16 eager_slots, u16 0,
 *   ndevs x {u16 lid, u8 port, u8 link_layer, u8 mtu, u8 gid_index,
 *            u16 devnum, u32 ctrl_rkey, u8 gid[16]},
 *   nqps x u32 qpn, u8 text_len, text,
 *   u8 nece (0 or ndevs), nece x {u32 vendor_id, u32 options, u32 comp_mask}.
 * ACCEPT: eager_addr = the receiver's eager ring (eager_slots slots of
 * eager_slot_bytes, 0 slots: no eager path), aux_addr = its want word; both
 * inside the completion-record region (ctrl_rkey). READY: aux_addr = the
 * sender's credit word, inside its CTS FIFO region; flags bits 0-1 = the
 * sender's NCCL_RAIL_IB_EAGER_ORDER (RAIL_IB_ORDER_*: the receiver decides
 * the eager ring's protocol, and says which in the credit word). ECE
 * (enhanced connection establishment), per device, vendor_id 0 for a
 * device without it: an ACCEPT carries what each receiver device's QPs
 * offer (ibv_query_ece), a READY what each sender device's QPs settled on
 * after ibv_set_ece; none (nece 0) with NCCL_IB_ECE_ENABLE=0.
 *
 * CTS entry, 64 bytes: u64 addr, u32 size, u32 ord, u32 rkey[8] (one per
 * receiver member device), i32 tag, u8 nreqs, u8 idx, u16 0, u32 credits,
 * u32 seq (written last; seq = CTS number + 1 marks the entry valid). ord is
 * the entry's ordinal among the receiver's entries with this tag; credits
 * the receiver's consumed eager-message count when it wrote the entry.
 *
 * Eager slot: the message's payload ends where the 16-byte trailer
 * {u32 size, i32 tag, u32 ord, u32 seq} begins, at the end of the slot; one
 * RDMA WRITE carries both, seq (eager message number + 1) written last. In
 * the order-safe protocol that write carries an immediate,
 * RAIL_IB_IMM_RING | (seq & RAIL_IB_IMM_RING_SEQ).
 * Want word (receiver memory, 16 bytes): {i32 tag, u32 ord, u32 0, u32 seq}.
 * Credit word (sender memory, 8 bytes): {u32 consumed, u16 want_ack, u16
 * flags}; flags bit 0 (ready) is set in every credit word: the receiver
 * writes the first one once its QPs are ready, and the sender writes
 * nothing (eager, want) before it sees it; bit 1 (safe): eager messages
 * must come as writes with immediate (the same in every credit word); bit
 * 2 (refused): the receiver failed the connection on an eager message
 * larger than its receive (see RAIL_IB_CREDIT_REFUSED for the fields).
 */
#ifndef RAIL_IB_WIRE_H
#define RAIL_IB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define RAIL_IB_WIRE_MAGIC 0x57424952u /* "RIBW" */
/*
 * 3: order-safe eager ring, ECE; 4: eager refusal; 5: LL words for small
 * order-safe messages; 6: MOVE and MOVE_READY (a comm moves to another path); 7: ECE in
 * MOVE, MOVE_READY says the ring turned order-safe; 8: MOVE's flags (left a device whose
 * port is up, away from home), PROBE, PROBE_ACK and PROBE_DONE (the move back's probe)
 */
#define RAIL_IB_WIRE_VERSION 8
#define RAIL_IB_HDR_SIZE 16
#define RAIL_IB_BODY_MAX 2048
#define RAIL_IB_WIRE_MAX_QPS 128
#define RAIL_IB_CTS_SIZE 64
#define RAIL_IB_REFUSE_TEXT 120

enum rail_ib_msg_type {
	RAIL_IB_MSG_HELLO = 1,	/* sender -> receiver: nonce, devices, QPs per device */
	RAIL_IB_MSG_ACCEPT = 2,	/* receiver -> sender: devices, QPNs, completion records */
	RAIL_IB_MSG_READY = 3,	/* sender -> receiver: QPNs, CTS FIFO */
	RAIL_IB_MSG_REFUSE = 4,	/* receiver -> sender: why the connection is refused */
	/*
	 * After the handshake, on the same socket (ib_move.c): either side, when
	 * the comm's path failed: its devices and new QPNs, and what it holds
	 * (struct rail_ib_move_state); then, its new QPs ready, MOVE_READY.
	 */
	RAIL_IB_MSG_MOVE = 5,
	RAIL_IB_MSG_MOVE_READY = 6,
	/*
	 * The probe of the way home after a move made with the port up
	 * (ib_probe.c), same socket, between moves. PROBE, sender -> receiver:
	 * nonce = the probe's number, devs[0] = the sender's home device, qpn[0]
	 * = its probe QP there. PROBE_ACK, receiver -> sender: nonce, and
	 * refuse_code 0 with devs[0] = the receiver's home device (ctrl_rkey:
	 * the rkey of its probe buffer), qpn[0] = its probe QP, ctrl_addr = the
	 * buffer, aux_addr = the 8 bytes the buffer holds; or refuse_code
	 * RAIL_IB_PROBE_REFUSED, no device, text = why. PROBE_DONE, sender ->
	 * receiver: nonce, refuse_code 0 the RDMA READ of that buffer gave those
	 * bytes (the way home works), else RAIL_IB_PROBE_FAILED and text = why.
	 */
	RAIL_IB_MSG_PROBE = 7,
	RAIL_IB_MSG_PROBE_ACK = 8,
	RAIL_IB_MSG_PROBE_DONE = 9,
	RAIL_IB_MSG_LAST = RAIL_IB_MSG_PROBE_DONE,
};

/* PROBE_ACK and PROBE_DONE refuse_code: the probe was not answered, or did not pass. */
#define RAIL_IB_PROBE_REFUSED 1
#define RAIL_IB_PROBE_FAILED 2

enum rail_ib_refuse_code {
	RAIL_IB_REFUSE_NONCE = 1,
	RAIL_IB_REFUSE_LINK_LAYER = 2,
	RAIL_IB_REFUSE_RESOURCES = 3,
};

/* HELLO and ACCEPT flags bit 0: the side runs with failover (NCCL_RAIL_FAILOVER=1). */
#define RAIL_IB_FLAG_FAILOVER 1
/* READY flags bits 0-1: the sender's NCCL_RAIL_IB_EAGER_ORDER, in the variable's order. */
enum { RAIL_IB_ORDER_AUTO = 0, RAIL_IB_ORDER_INORDER = 1, RAIL_IB_ORDER_SAFE = 2 };
#define RAIL_IB_READY_ORDER_MASK 3

struct rail_ib_wire_dev {
	uint16_t lid;
	uint8_t port;
	uint8_t link_layer;
	uint8_t mtu;		/* enum ibv_mtu */
	uint8_t gid_index;
	uint16_t devnum;	/* its side's device number + 1; 0: unknown (older peers sent 0) */
	uint32_t ctrl_rkey;
	uint8_t gid[16];
};

/* ECE of one device (struct ibv_ece's fields); vendor_id 0: none. */
struct rail_ib_ece {
	uint32_t vendor_id;
	uint32_t options;
	uint32_t comp_mask;
};

/*
 * What a side of a moving comm holds once its old QPs are drained (MOVE).
 * Receiver: the CTS number of the next answer per QP (ans[]), the next CTS
 * number, eager messages seen (a prefix) and consumed. Sender: the next CTS
 * it takes (seq), eager messages written.
 */
struct rail_ib_move_state {
	uint32_t epoch;		/* the comm's moves, this one included */
	uint8_t role;		/* 0 sender, 1 receiver */
	uint8_t reason;		/* RAIL_IB_MOVE_* */
	uint8_t flags;		/* RAIL_IB_MOVE_F_* */
	uint64_t seq;		/* sender: next CTS to take; receiver: next CTS to write */
	uint32_t e_seen;	/* receiver: eager messages placed or seen; sender: written */
	uint32_t e_head;	/* receiver: eager messages consumed */
	int nans;		/* receiver: nqps; sender: 0 */
	uint64_t ans[RAIL_IB_WIRE_MAX_QPS];
};

/*
 * MOVE flags. AVOID: this side leaves a device whose port is up (a path that
 * failed again: no port event will say when it works). AWAY: after this
 * move this side is on another device than the one the comm was made on.
 */
#define RAIL_IB_MOVE_F_AVOID 1u
#define RAIL_IB_MOVE_F_AWAY 2u

enum rail_ib_move_reason {
	RAIL_IB_MOVE_PORT_ERR = 1,	/* the side's own port went down */
	RAIL_IB_MOVE_WC_ERR = 2,	/* a completion error on the path */
	RAIL_IB_MOVE_PEER = 3,		/* joins the peer's move */
	RAIL_IB_MOVE_BACK = 4,		/* the original port is back */
	RAIL_IB_MOVE_FATAL = 5,		/* DEVICE_FATAL on the side's device */
	RAIL_IB_MOVE_QP = 6,		/* QP_FATAL on one of the side's QPs */
	RAIL_IB_MOVE_STALL = 7,		/* completions owed, none for NCCL_RAIL_IB_STALL_TIMEOUT */
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
	uint64_t eager_addr;
	uint64_t aux_addr;
	uint32_t eager_slot_bytes;
	int eager_slots;
	struct rail_ib_wire_dev devs[RAIL_MAX_VDEV_DEVS];
	uint32_t qpn[RAIL_IB_WIRE_MAX_QPS];
	char text[RAIL_IB_REFUSE_TEXT + 1];
	int nece;		/* 0 or ndevs */
	struct rail_ib_ece ece[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_move_state move;	/* MOVE only */
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
	uint32_t ord;
	uint32_t credits;
	uint32_t seq;
};

void rail_ib_cts_encode(const struct rail_ib_cts *c, uint8_t *p);
/* The seq field, read atomically (the NIC may be writing the entry). */
uint32_t rail_ib_cts_seq(const uint8_t *p);
/*
 * Decode an entry whose seq is expected: -EAGAIN if not there yet, -EBADMSG
 * (why) when present but malformed (nreqs, idx, size).
 */
int rail_ib_cts_decode(const uint8_t *p, uint32_t expect_seq, int expect_idx,
		       struct rail_ib_cts *c, char *why, size_t why_len);

/*
 * Immediate data of the completing write: a size (one receive), a count
 * (grouped receive: the sizes are in the completion record), a refusal
 * (the sender's message does not fit buffer idx; size saturates at 2^27-1),
 * or "eager" (one receive whose message went through the eager ring). And,
 * not an answer to a CTS: "ring" (an eager message written with immediate,
 * the low 29 bits of its seq; the order-safe protocol).
 */
#define RAIL_IB_IMM_MULTI 0x80000000u
#define RAIL_IB_IMM_RING 0xa0000000u
#define RAIL_IB_IMM_RING_MASK 0xe0000000u
#define RAIL_IB_IMM_RING_SEQ 0x1fffffffu
#define RAIL_IB_IMM_REFUSED 0xc0000000u
#define RAIL_IB_IMM_REFUSED_SIZE_MAX ((1u << 27) - 1)
#define RAIL_IB_IMM_EAGER_VALUE 0x7fffffffu
enum rail_ib_imm_kind {
	RAIL_IB_IMM_SIZE = 0,
	RAIL_IB_IMM_COUNT = 1,
	RAIL_IB_IMM_REFUSAL = 2,
	RAIL_IB_IMM_EAGER = 3,
	RAIL_IB_IMM_RING_MSG = 4,
};
uint32_t rail_ib_imm_single(size_t size);
uint32_t rail_ib_imm_multi(int nreqs);
uint32_t rail_ib_imm_refused(int idx, size_t size);
uint32_t rail_ib_imm_eager(void);
/* An eager message written with immediate: seq = its number + 1. */
uint32_t rail_ib_imm_ring(uint32_t seq);
/*
 * The kind, with *value (size, count, or a ring seq's low 29 bits) and
 * *idx; -EBADMSG for a value no sender produces.
 */
int rail_ib_imm_decode(uint32_t imm, uint64_t *value, int *idx);

/*
 * Completion record: nreqs x u32, the received size of each buffer, or
 * RAIL_IB_SIZE_EAGER for a buffer whose message went through the eager ring.
 */
#define RAIL_IB_SIZE_EAGER 0xffffffffu
void rail_ib_sizes_encode(const uint32_t *sizes, int n, uint8_t *p);
/* -EBADMSG for a value that is neither a size (<= 1 GiB) nor RAIL_IB_SIZE_EAGER. */
int rail_ib_sizes_decode(const uint8_t *p, int n, uint32_t *sizes);

/* ---- the eager path ------------------------------------------------------ */
#define RAIL_IB_EAGER_TRAILER 16
#define RAIL_IB_EAGER_MAX_SLOTS 1024
#define RAIL_IB_EAGER_MAX_SLOT_BYTES 65536
#define RAIL_IB_WANT_SIZE 16
#define RAIL_IB_CREDIT_SIZE 8

struct rail_ib_eager_hdr {
	uint32_t size;
	int32_t tag;
	uint32_t ord;
	uint32_t seq;
};
/* Write the trailer at p (the last RAIL_IB_EAGER_TRAILER bytes of the slot's image). */
void rail_ib_eager_encode(const struct rail_ib_eager_hdr *h, uint8_t *p);
/* The trailer's seq, read atomically (the NIC may be writing the slot). */
uint32_t rail_ib_eager_seq(const uint8_t *p);
/*
 * Decode the trailer at p: -EAGAIN while its seq is not expect_seq (not
 * arrived), -EBADMSG (why) when the size exceeds max_payload.
 */
int rail_ib_eager_decode(const uint8_t *p, uint32_t expect_seq, uint32_t max_payload,
			 struct rail_ib_eager_hdr *h, char *why, size_t why_len);

/*
 * LL image (order-safe ring, payloads of at most RAIL_IB_LL_MAX bytes): a
 * message as 8-byte words, each 4 bytes of content and 4 bytes of flag
 * (rail_ib_ll_flag of the message's seq), ascending: the payload's words,
 * then ord, tag and size. The NIC writes an aligned 8-byte word whole
 * however it orders the words of a write (NCCL's LL protocol rests on the
 * same), so a message whose every flag is its own is all there: no
 * completion to poll, under any placement. Images end at the end of the
 * slot, in the last RAIL_IB_LL_BYTES, which no other image touches (those
 * end before it): a stale word there is an LL word of an older seq.
 */
#define RAIL_IB_LL_BYTES 512
#define RAIL_IB_LL_HDR_WORDS 3
#define RAIL_IB_LL_MAX ((RAIL_IB_LL_BYTES / 8 - RAIL_IB_LL_HDR_WORDS) * 4)

/* Bytes of the LL image of a payload of size bytes. */
static inline uint32_t rail_ib_ll_bytes(uint32_t size)
{
	return 8 * (RAIL_IB_LL_HDR_WORDS + (size + 3) / 4);
}

/* Encode h (seq included) and the payload at out; returns the image's bytes. */
uint32_t rail_ib_ll_encode(const struct rail_ib_eager_hdr *h, const void *payload, uint8_t *out);
/* Whether the last word before end (the size word) carries seq's flag: one load. */
int rail_ib_ll_ready(const uint8_t *end, uint32_t seq);
/*
 * The header words of the image that ends at end: -EAGAIN while one's flag
 * is not seq's, -EBADMSG (why) for a size above max_payload.
 */
int rail_ib_ll_head(const uint8_t *end, uint32_t seq, uint32_t max_payload,
		    struct rail_ib_eager_hdr *h, char *why, size_t why_len);
/* Its payload of size bytes (from the header) to dst: -EAGAIN while a word is not placed. */
int rail_ib_ll_payload(const uint8_t *end, uint32_t seq, uint32_t size, uint8_t *dst);
/*
 * Both: decode the image that ends at end into h and the payload, which ends at
 * payload_end (room for RAIL_IB_LL_MAX bytes before it): -EAGAIN while a
 * word's flag is not seq's (not all of it placed; the payload's bytes may
 * be partly written), -EBADMSG (why) for a size above max_payload.
 */
int rail_ib_ll_decode(const uint8_t *end, uint32_t seq, uint32_t max_payload,
		      struct rail_ib_eager_hdr *h, uint8_t *payload_end, char *why, size_t why_len);

struct rail_ib_want {
	int32_t tag;
	uint32_t ord;
	uint32_t seq;
};
void rail_ib_want_encode(const struct rail_ib_want *w, uint8_t *p);
/* -EAGAIN when the seq equals last_seq (nothing new), else 0. */
int rail_ib_want_decode(const uint8_t *p, uint32_t last_seq, struct rail_ib_want *w);

#define RAIL_IB_CREDIT_READY 1u
#define RAIL_IB_CREDIT_SAFE 2u
/*
 * The receiver refused an eager message that does not fit its receive; the
 * connection is failed. In that word consumed = size << 16 | room (both
 * below 64 KiB: an eager payload fits one slot) and want_ack = the eager
 * message number's low 16 bits; nothing else is written after it.
 */
#define RAIL_IB_CREDIT_REFUSED 4u
/* READY is added to flags. */
void rail_ib_credit_encode(uint32_t consumed, uint16_t want_ack, uint16_t flags, uint8_t *p);
/* Read atomically (the NIC may be writing it); flags are 0 until the receiver wrote one. */
void rail_ib_credit_decode(const uint8_t *p, uint32_t *consumed, uint16_t *want_ack,
			   uint16_t *flags);

/*
 * The connection handle's payload (handle.h, outside this wire's version):
 * n x 16 bytes, the GIDs of the listener's RoCE ports (at most
 * RAIL_IB_HANDLE_GIDS, NCCL's two) with NCCL_IB_SUBNET_AWARE_ROUTING on, for
 * the connector's choice of device (ib_subnet.c); empty otherwise, and from
 * releases before it.
 */
#define RAIL_IB_HANDLE_GIDS 2
/* Writes min(n, RAIL_IB_HANDLE_GIDS) GIDs; returns the payload's length. */
size_t rail_ib_handle_gids_encode(const uint8_t (*gids)[16], int n, uint8_t *payload);
/* The number of GIDs, or -EBADMSG for a length that is not 16 x 0..RAIL_IB_HANDLE_GIDS. */
int rail_ib_handle_gids_decode(const uint8_t *payload, size_t len, uint8_t (*gids)[16]);

#endif
