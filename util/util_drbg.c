/* util_drbg.c - mbedTLS CTR-DRBG seeded from the system's entropy (util.h). */
#include <errno.h>
#include <string.h>

#include "util.h"

int util_drbg_seed(mbedtls_entropy_context *ent, mbedtls_ctr_drbg_context *drbg, const char *pers)
{
    mbedtls_entropy_init(ent);
    mbedtls_ctr_drbg_init(drbg);
    if (mbedtls_ctr_drbg_seed(drbg, mbedtls_entropy_func, ent, (const unsigned char *)pers,
                              pers ? strlen(pers) : 0) != 0)
        return -EIO;
    return 0;
}

void util_drbg_free(mbedtls_entropy_context *ent, mbedtls_ctr_drbg_context *drbg)
{
    mbedtls_ctr_drbg_free(drbg);
    mbedtls_entropy_free(ent);
}

int util_random_bytes(const char *pers, unsigned char *out, size_t n)
{
    mbedtls_entropy_context ent;
    mbedtls_ctr_drbg_context drbg;
    int r = util_drbg_seed(&ent, &drbg, pers);

    if (!r && mbedtls_ctr_drbg_random(&drbg, out, n) != 0)
        r = -EIO;
    util_drbg_free(&ent, &drbg);
    return r;
}
