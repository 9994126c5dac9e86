/*
 * session_frame.h - the frames of the agent socket "warren.session.v1"
 * (docs/API.md "Agent socket"): one msgpack map per WebSocket message.
 *
 * Pure code over bytes, no I/O, so it can be fuzzed (tests/fuzz/fuzz_session.c).
 *
 * Decoding: sf_decode() checks a whole message before msgpack-c sees it
 * (sf_check: every container's announced count must fit in the bytes left, nesting
 * at most SF_DEPTH_MAX, no trailing bytes), so a 5-byte frame cannot make msgpack-c
 * allocate for four billion elements. The request's fields other than id, op and
 * data become a jansson object (req->args, the caller's: sf_req_clear). req->data
 * points INTO the caller's buffer: valid only while that buffer is.
 *
 * Encoding: answers are built in a struct sf_buf that keeps `head` spare bytes in
 * front (LWS_PRE for lws_write); the buffer is the caller's (sf_buf_free).
 */
#ifndef WARREN_SESSION_FRAME_H
#define WARREN_SESSION_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define SF_DEPTH_MAX 16
#define SF_OP_MAX    16

enum sf_op {
    SF_OP_EXEC = 0,
    SF_OP_STDIN,
    SF_OP_SIGNAL,
    SF_OP_RESIZE,
    SF_OP_ATTACH,
    SF_OP_DETACH,
    SF_OP_PROCESSES,
    SF_OP_READ_FILE,
    SF_OP_WRITE_FILE,
    SF_OP_STAT,
    SF_OP_LIST,
    SF_OP_MKDIR,
    SF_OP_REMOVE,
    SF_OP_RENAME,
    SF_OP_WATCH,
    SF_OP__COUNT
};

struct sf_req {
    uint32_t id;
    enum sf_op op;
    json_t *args;        /* every other field except data; never NULL after success */
    const uint8_t *data; /* "data" (bin or str), or NULL */
    size_t data_len;
};

/* Structural check alone: 0, or -EINVAL (not one complete msgpack value). */
int sf_check(const void *buf, size_t len);
/* Decode one request. 0, or -EINVAL with a reason for the close frame in why. */
int sf_decode(const void *buf, size_t len, struct sf_req *out, char *why, size_t whycap);
void sf_req_clear(struct sf_req *r);
const char *sf_op_name(enum sf_op op);

struct sf_buf {
    unsigned char *p;
    size_t len; /* bytes used, head included */
    size_t cap;
    size_t head; /* spare bytes kept in front of the message */
    bool oom;
};

void sf_buf_init(struct sf_buf *b, size_t head);
void sf_buf_free(struct sf_buf *b);
/* The message bytes (after head) and their length. */
static inline unsigned char *sf_buf_msg(struct sf_buf *b)
{
    return b->p + b->head;
}
static inline size_t sf_buf_msg_len(const struct sf_buf *b)
{
    return b->len - b->head;
}
/* {"id", "type", "offset", "data": bin}: output and file data. 0 or -ENOMEM. */
int sf_enc_data(struct sf_buf *b, uint32_t id, const char *type, uint64_t offset, const void *p,
                size_t n);
/* The object obj (borrowed) with "id" first and, if type is set, "type" (replacing
 * obj's own). 0, or -ENOMEM. */
int sf_enc_json(struct sf_buf *b, uint32_t id, const char *type, json_t *obj);
/* {"id","type":"error","code","message"}. */
int sf_enc_error(struct sf_buf *b, uint32_t id, const char *code, const char *msg);

#endif
