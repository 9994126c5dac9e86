/*
 * proto.h - host <-> guest frames, shared by warrend and warren-init.
 *
 * Wire format (see protocol/README.md): every frame is a 4-byte big-endian
 * payload length followed by one msgpack map whose keys are short strings.
 * Key "t" (frame type) is always present; "id" names the stream/request the
 * frame belongs to (0 for channel-level frames).
 *
 * Decoding is a pure function over bytes: proto_frame_split() finds a whole
 * frame in a buffer, proto_decode() validates its map against the key table
 * and fills a struct proto_frame whose strings, bins and arrays point into
 * the caller's buffer or the msgpack zone. Nothing here does I/O.
 *
 * Ownership: a decoded frame borrows from the input buffer and from the
 * msgpack_zone the caller passed to proto_decode(); both must outlive the
 * frame.
 * Encoders append to a struct proto_buf the caller owns.
 */
#ifndef WARREN_PROTO_H
#define WARREN_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <msgpack.h>

#define PROTO_VERSION   2
#define PROTO_HDR       4             /* length prefix */
#define PROTO_MAX_FRAME (256 * 1024)  /* hard cap on a payload */
#define PROTO_MAX_DATA  (64 * 1024)   /* bytes of "data" per frame */
#define PROTO_WINDOW    (1024 * 1024) /* initial credit per stream, each way */
#define PROTO_ENTROPY   64            /* bytes of host entropy in INIT */
#define PROTO_TAG_MAX   256           /* bytes of an EXEC tag */
#define PROTO_CMD_SHOWN 1024          /* bytes of a command line in a PLIST entry */
#define PROTO_BOOT_ID   36            /* bytes of a RESYNC boot id: 8-4-4-4-12 lowercase hex */
#define PROTO_HOST_MAX  64            /* bytes of a RESYNC hostname (the kernel's HOST_NAME_MAX) */

/* Frame types. g->h: guest to host, h->g: host to guest. */
enum proto_type {
    PROTO_HELLO = 1, /* g->h {id, v, kernel}: id 0 when the agent opens the port, else the
                      * id of the INIT it answers (the host is ready at that HELLO) */
    PROTO_INIT,      /* h->g {id, v, time_ns, entropy, hostname, mem_mb, ring, max_procs}: a new
                      * host session. Streams of an earlier session end (foreground processes
                      * killed); background processes and PTYs keep running (v2). */
    PROTO_EXEC,      /* h->g {id, argv | cmd, env, cwd, user, timeout_ms, stdin, bg, tag, cols,
                      * rows}: bg or cols+rows -> RESULT {id, pid} ends the stream */
    PROTO_STDIN,     /* h->g {id, data?, eof?}: bytes for a process's stdin */
    PROTO_SIGNAL,    /* h->g {id, sig}: signal a process group */
    PROTO_OUT,       /* g->h {id, fd, off, data}: process output, off counts per fd */
    PROTO_EXIT,      /* g->h {id, code, sig, timed_out}: process ended; last frame of id */
    PROTO_CREDIT,    /* both {id, n}: receiver consumed n bytes of data of stream id */
    PROTO_FWRITE,    /* h->g {id, path, mode}: open file for write; then DATA*, END */
    PROTO_FREAD,     /* h->g {id, path}: guest answers RESULT{size,..}, DATA*, END */
    PROTO_DATA,      /* both {id, off, data}: file content */
    PROTO_END,       /* both {id}: no more DATA for id */
    PROTO_STAT,      /* h->g {id, path} -> RESULT {name,type,size,mode,mtime} */
    PROTO_LIST,      /* h->g {id, path, depth} -> RESULT {entries:[{path,name,type,size,mode,
                      * mtime}], eof} one or more times; the last has eof=true */
    PROTO_MKDIR,     /* h->g {id, path, mode?} -> RESULT {} */
    PROTO_REMOVE,    /* h->g {id, path, recursive} -> RESULT {} */
    PROTO_RENAME,    /* h->g {id, path, to} -> RESULT {} */
    PROTO_RESULT,    /* g->h {id, ...}: request succeeded (FWRITE: {size}) */
    PROTO_ERROR,     /* g->h {id, code (errno), msg}: request failed; last frame of id */
    PROTO_PING,      /* h->g {id} -> PONG {id} */
    PROTO_PONG,
    /* v2: processes that belong to the sandbox (background execs, PTYs). */
    PROTO_ATTACH, /* h->g {id, pid, off, follow} -> OUT {id, fd, off, data, lost?}*, EXIT or END */
    PROTO_DETACH, /* h->g {id}: stop attach stream id -> END {id} */
    PROTO_PLIST,  /* h->g {id, pid?} -> RESULT {id, procs} */
    PROTO_PCTL,   /* h->g {id, pid, data?, eof?, sig?, cols?, rows?} -> RESULT {id} or ERROR */
    /* v2, appended: set the clock, entropy, boot id and hostname of a guest that was stopped,
     * restored or cloned, without touching any stream or process (INIT ends streams). */
    PROTO_RESYNC, /* h->g {id, time_ns, entropy, boot_id?, hostname?} -> RESULT {id} or ERROR */
    PROTO_TYPE_MAX
};

/* Keys. Each has one wire type, checked by the decoder. */
enum proto_key {
    PK_T,         /* uint: frame type */
    PK_ID,        /* uint32 */
    PK_V,         /* uint: protocol version */
    PK_KERNEL,    /* str */
    PK_TIME_NS,   /* uint: host CLOCK_REALTIME in ns */
    PK_ENTROPY,   /* bin */
    PK_HOSTNAME,  /* str */
    PK_ARGV,      /* array of str */
    PK_CMD,       /* str: run with /bin/sh -c */
    PK_ENV,       /* map str -> str */
    PK_CWD,       /* str */
    PK_USER,      /* str: "root" or "user" */
    PK_TIMEOUT,   /* uint: ms, 0 = none */
    PK_STDIN,     /* bool: keep stdin open for STDIN frames (else /dev/null) */
    PK_DATA,      /* bin */
    PK_EOF,       /* bool */
    PK_SIG,       /* int */
    PK_FD,        /* uint: 1 stdout, 2 stderr */
    PK_OFF,       /* uint: byte offset of data in its stream */
    PK_CODE,      /* int: exit code, or errno in ERROR */
    PK_TIMED_OUT, /* bool */
    PK_N,         /* uint: credit bytes */
    PK_PATH,      /* str */
    PK_TO,        /* str */
    PK_MODE,      /* uint */
    PK_DEPTH,     /* uint */
    PK_RECURSIVE, /* bool */
    PK_SIZE,      /* uint */
    PK_MTIME,     /* int: seconds */
    PK_TYPE,      /* str: "file", "dir", "symlink", "other" */
    PK_NAME,      /* str */
    PK_ENTRIES,   /* array of maps with the stat keys */
    PK_MSG,       /* str */
    PK_MEM_MB,    /* uint: memory the host gave the VM */
    /* v2 */
    PK_BG,        /* bool: EXEC in the background (outlives its stream) */
    PK_TAG,       /* str: EXEC: client label (<= PROTO_TAG_MAX bytes) */
    PK_COLS,      /* uint: EXEC: open a PTY of this size; PCTL: resize */
    PK_ROWS,      /* uint */
    PK_PID,       /* uint: a background process (guest pid) */
    PK_LOST,      /* uint: OUT of an attach stream: bytes skipped just before this frame */
    PK_FOLLOW,    /* bool: ATTACH: keep streaming live output after catching up */
    PK_PROCS,     /* array of maps: RESULT of PLIST */
    PK_RING,      /* uint: INIT: ring bytes per background process */
    PK_MAX_PROCS, /* uint: INIT: most background processes + PTYs (running or kept) */
    PK_BOOT_ID,   /* str: RESYNC: the guest's new boot id, a PROTO_BOOT_ID-byte UUID */
    PK__COUNT
};

struct proto_str {
    const char *p;
    uint32_t len;
};

union proto_val {
    uint64_t u;
    int64_t i;
    bool b;
    struct proto_str s;              /* str and bin */
    const msgpack_object_array *arr; /* PK_ARGV (strs), PK_ENTRIES, PK_PROCS (maps) */
    const msgpack_object_map *map;   /* PK_ENV (str -> str) */
};

struct proto_frame {
    uint32_t type;
    uint32_t id;
    uint64_t have; /* bit (1 << key) set when the key was present */
    union proto_val v[PK__COUNT];
};

static inline bool proto_has(const struct proto_frame *f, enum proto_key k)
{
    return (f->have >> k) & 1;
}

/* Error codes (negative), beside negative errno values. */
#define PROTO_EAGAIN   (-11)   /* == -EAGAIN: need more bytes */
#define PROTO_ETOOBIG  (-1001) /* payload over PROTO_MAX_FRAME */
#define PROTO_EMSGPACK (-1002) /* not one well-formed msgpack object */
#define PROTO_ESCHEMA  (-1003) /* not a map, unknown type, wrong key type, missing t */
const char *proto_strerror(int err);
const char *proto_type_name(uint32_t type);

/*
 * Find one frame at the start of buf. On success returns 0 and sets
 * payload, payload_len and consumed (header + payload). PROTO_EAGAIN when
 * more bytes are needed; PROTO_ETOOBIG when the announced length is over
 * the cap (the stream is then unusable: close it).
 */
int proto_frame_split(const uint8_t *buf, size_t len, const uint8_t **payload, size_t *payload_len,
                      size_t *consumed);

/*
 * Decode one payload into *f. Unknown keys are ignored (forward
 * compatibility); known keys with the wrong wire type are an error. The
 * zone receives msgpack's allocations; pass a zone initialised with
 * msgpack_zone_init and clear it when the frame is no longer used.
 */
int proto_decode(const uint8_t *payload, size_t len, msgpack_zone *zone, struct proto_frame *f);
/* A RESYNC frame decodes only whole: time_ns and 1..PROTO_ENTROPY bytes of entropy present,
 * boot_id (if any) proto_boot_id_ok, hostname (if any) 1..PROTO_HOST_MAX bytes without NUL;
 * else PROTO_ESCHEMA. */

/* A boot id as RESYNC carries it: PROTO_BOOT_ID bytes, 8-4-4-4-12 lowercase hex digits. */
bool proto_boot_id_ok(const char *p, size_t len);

/* Convenience: copy a str value into a NUL-terminated buffer; -ENAMETOOLONG if it does not fit,
 * -EINVAL if it contains a NUL byte. */
int proto_str_copy(const struct proto_str *s, char *dst, size_t cap);

/* ---- encoding ---- */

/* A growable byte buffer; also used as an output queue with a read cursor. */
struct proto_buf {
    uint8_t *p;
    size_t len; /* bytes written */
    size_t off; /* bytes already consumed from the front */
    size_t cap;
};
void proto_buf_init(struct proto_buf *b);
void proto_buf_free(struct proto_buf *b);
int proto_buf_append(struct proto_buf *b, const void *p, size_t n);
/* Drop n consumed bytes from the front (compacts lazily). */
void proto_buf_consume(struct proto_buf *b, size_t n);
static inline size_t proto_buf_pending(const struct proto_buf *b)
{
    return b->len - b->off;
}

/*
 * Frame encoder: proto_enc_begin() writes the length placeholder and a map
 * header for nkeys entries *including* "t" and "id" (so nkeys >= 2);
 * the caller then adds exactly nkeys - 2 keys with the put functions or
 * raw msgpack through enc->pk after proto_enc_key(); proto_enc_end() patches
 * the length. Returns PROTO_ETOOBIG if the frame grew past the cap, or
 * -ENOMEM if the buffer could not grow (the frame is then removed).
 */
struct proto_enc {
    struct proto_buf *buf;
    size_t start; /* frame start, relative to buf->off (appends may compact the buffer) */
    int err;      /* first append failure; proto_enc_end() then drops the frame */
    msgpack_packer pk;
};
int proto_enc_begin(struct proto_enc *e, struct proto_buf *buf, enum proto_type t, uint32_t id,
                    uint32_t nkeys);
void proto_enc_key(struct proto_enc *e, enum proto_key k);
void proto_put_u(struct proto_enc *e, enum proto_key k, uint64_t v);
void proto_put_i(struct proto_enc *e, enum proto_key k, int64_t v);
void proto_put_b(struct proto_enc *e, enum proto_key k, bool v);
void proto_put_str(struct proto_enc *e, enum proto_key k, const char *s, size_t n);
void proto_put_cstr(struct proto_enc *e, enum proto_key k, const char *s);
void proto_put_bin(struct proto_enc *e, enum proto_key k, const void *p, size_t n);
int proto_enc_end(struct proto_enc *e);

/* Name of key k on the wire (e.g. "timeout_ms"). */
const char *proto_key_name(enum proto_key k);

/* Shorthand for the common small frames. */
int proto_send_credit(struct proto_buf *b, uint32_t id, uint64_t n);
int proto_send_end(struct proto_buf *b, uint32_t id);
int proto_send_error(struct proto_buf *b, uint32_t id, int errnum, const char *msg);

#endif
