/* fake_vmm.c - vmm_detect_accel for warrend_fake (main.c without the VMM driver). */
#include <stdio.h>

#include "vmm.h"

enum vmm_accel vmm_detect_accel(char *why, size_t why_cap)
{
    snprintf(why, why_cap, "fake VMM driver: always TCG");
    return VMM_ACCEL_TCG;
}
