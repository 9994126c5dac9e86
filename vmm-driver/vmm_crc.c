/* vmm_crc.c - the checksums of snapshot files: CRC-32 (IEEE 802.3, reflected;
 * zlib's) and CRC-32C (Castagnoli, reflected; iSCSI's, what SSE 4.2's crc32
 * instruction computes). Alone in its file so the fuzz build can leave its loops
 * without comparison tracing, which made them most of fuzz_snap's time and finds
 * nothing in them.
 *
 * A save and a restore each checksum a whole stream (a booted sandbox's RAM,
 * ~70 MiB). In software, eight bytes per step through eight tables ("slicing
 * by 8"): 36 ms for 70 MiB here, a quarter of a booted sandbox's pause (one
 * table lookup per byte took 372 ms in a Debug build). CRC-32C takes the crc32
 * instruction where the CPU has it (x86-64 with SSE 4.2), eight bytes a cycle
 * or so, and the same tables elsewhere. Snapshot files of version 3 carry a
 * CRC-32C of their stream; version 2's CRC-32 is still read (vmm_snap.c). */
#include "vmm_int.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define POLY_CRC32  0xedb88320u
#define POLY_CRC32C 0x82f63b78u

static uint32_t tab32[8][256], tab32c[8][256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;
static bool have_sse42;

static void tab_fill(uint32_t tab[8][256], uint32_t poly)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? poly ^ (c >> 1) : c >> 1;
        tab[0][i] = c;
    }
    /* tab[k][i]: the CRC of byte i followed by k zero bytes. */
    for (int k = 1; k < 8; k++)
        for (uint32_t i = 0; i < 256; i++)
            tab[k][i] = (tab[k - 1][i] >> 8) ^ tab[0][tab[k - 1][i] & 0xff];
}

static void crc_init(void)
{
    tab_fill(tab32, POLY_CRC32);
    tab_fill(tab32c, POLY_CRC32C);
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Slicing by 8 over one of the table sets; crc is the running value, not inverted. */
static uint32_t crc_tables(uint32_t tab[8][256], uint32_t crc, const uint8_t *p, size_t n)
{
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ le32(p), hi = le32(p + 4);
        crc = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^ tab[5][(lo >> 16) & 0xff] ^
              tab[4][lo >> 24] ^ tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^
              tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
    }
    while (n--)
        crc = tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_insn(uint32_t crc, const uint8_t *p,
                                                              size_t n)
{
    uint64_t c;

    for (; n && ((uintptr_t)p & 7); n--)
        crc = _mm_crc32_u8(crc, *p++);
    c = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    crc = (uint32_t)c;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

uint32_t vmm_crc32(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&tab_once, crc_init);
    return ~crc_tables(tab32, ~crc, buf, n);
}

uint32_t vmm_crc32c_soft(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&tab_once, crc_init);
    return ~crc_tables(tab32c, ~crc, buf, n);
}

uint32_t vmm_crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&tab_once, crc_init);
#if defined(__x86_64__)
    if (have_sse42)
        return ~crc32c_insn(~crc, buf, n);
#endif
    return ~crc_tables(tab32c, ~crc, buf, n);
}

/* Appending n zero bytes to a message multiplies its (un-inverted) CRC register by
 * x^(8n) modulo the polynomial: O(log n) products instead of n bytes, so a RAM file's
 * holes cost nothing to checksum. Polynomials here are reflected like the register:
 * bit 31 is x^0. */
static uint32_t gf2_mul(uint32_t a, uint32_t b, uint32_t poly)
{
    uint32_t p = 0;

    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            p ^= b;
        b = b & 1 ? (b >> 1) ^ poly : b >> 1; /* b * x */
    }
    return p;
}

uint32_t vmm_crc32c_zeros(uint32_t crc, uint64_t n)
{
    uint32_t reg = ~crc, sq = 1u << 23; /* x^8: one byte */

    for (; n; n >>= 1) {
        if (n & 1)
            reg = gf2_mul(sq, reg, POLY_CRC32C);
        sq = gf2_mul(sq, sq, POLY_CRC32C); /* x^(8 * 2^k) for the next bit */
    }
    return ~reg;
}
