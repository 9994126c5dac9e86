/* vmm_crc.c - CRC-32 (IEEE 802.3, reflected; zlib's) for snapshot files.
 * Alone in its file so the fuzz build can leave its loop without comparison
 * tracing, which made it most of fuzz_snap's time and finds nothing in it.
 *
 * Eight bytes per step through eight tables ("slicing by 8"): a save and a
 * restore each checksum the whole stream (the guest's RAM for a sandbox
 * snapshot, ~70 MiB), and one table lookup per byte took 372 ms for 70 MiB
 * in a Debug build here (a third of a snapshot's latency). */
#include "vmm_int.h"

#include <pthread.h>

static uint32_t tab[8][256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        tab[0][i] = c;
    }
    /* tab[k][i]: the CRC of byte i followed by k zero bytes. */
    for (int k = 1; k < 8; k++)
        for (uint32_t i = 0; i < 256; i++)
            tab[k][i] = (tab[k - 1][i] >> 8) ^ tab[0][tab[k - 1][i] & 0xff];
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t vmm_crc32(uint32_t crc, const void *buf, size_t n)
{
    const uint8_t *p = buf;

    pthread_once(&tab_once, crc_init);
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ le32(p), hi = le32(p + 4);
        crc = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^ tab[5][(lo >> 16) & 0xff] ^
              tab[4][lo >> 24] ^ tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^
              tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
    }
    while (n--)
        crc = tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}
