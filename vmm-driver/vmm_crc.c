/* vmm_crc.c - CRC-32 (IEEE 802.3, reflected; zlib's) for snapshot files.
 * Alone in its file so the fuzz build can leave its loop without comparison
 * tracing, which made it most of fuzz_snap's time and finds nothing in it. */
#include "vmm_int.h"

static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t vmm_crc32(uint32_t crc, const void *buf, size_t n)
{
    const uint8_t *p = buf;

    /* Idempotent and cheap; racing initialisers write the same values. */
    if (!crc_table[1])
        crc_init();
    crc = ~crc;
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}
