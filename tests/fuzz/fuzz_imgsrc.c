/*
 * fuzz_imgsrc.c - the image source's index parser (server/images_src.c): an index comes
 * from a shared source over plain HTTP. Whatever it accepts is within its bounds, and
 * formats back to the exact bytes it was given.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "images_src.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct imgsrc_entry v[IMGSRC_FILES_MAX];
    static char out[IMGSRC_INDEX_MAX + 1];
    char err[256];
    size_t n = 0, len;

    if (imgsrc_index_parse((const char *)data, size, 1ull << 40, v, IMGSRC_FILES_MAX, &n, err,
                           sizeof(err)) != 0) {
        if (!err[0])
            abort();
        return 0;
    }
    if (n > IMGSRC_FILES_MAX)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!imgsrc_name_ok(v[i].name) || strlen(v[i].sha) != IMGSRC_HEX_LEN ||
            v[i].size > (1ull << 40) || (i && strcmp(v[i - 1].name, v[i].name) >= 0))
            abort();
    len = imgsrc_index_format(v, n, out, sizeof(out));
    if (len != size || memcmp(out, data, size) != 0)
        abort();
    return 0;
}
