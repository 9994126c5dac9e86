/*
 * vmm_prefault.c - touch a waiting QEMU's TCG translation buffer ahead (the
 * blocking steps of vmm_prefault_tcg; vmm.c runs them in slices from the loop).
 *
 * Under TCG, QEMU translates guest code into one anonymous read-write-execute
 * mapping (tb-size MiB) and fills it from its start. Each page it reaches for
 * the first time is a page fault, which costs 10-14 us on these machines: a
 * clone restored into a spare QEMU takes ~800 of them to answer and ~3,000
 * more in its first exec (load/RESULTS.md). Writing zeros, ahead of time,
 * into the pages of that buffer the process has never touched moves those
 * faults out of the create.
 *
 * Only pages /proc/PID/pagemap shows absent are written: an anonymous page
 * that was never touched reads as zeros, so writing zeros changes nothing QEMU
 * could see, as long as QEMU itself does not write into the same page in
 * between. That holds for a QEMU whose guest has never run (the caller's
 * rule, vmm.h): what it had to write there (TCG's prologue) it wrote before
 * it answered QMP. A page QEMU touched is left alone whatever it holds.
 *
 * The process is named by /proc only after a check through the pidfd that it
 * is still the VM's; the files opened then stay that process's even if its
 * pid is reused later.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vmm_int.h"

#define PF_PAGE     4096u
#define PF_PRESENT  (1ull << 63)
#define PF_SWAPPED  (1ull << 62)
#define PF_MIN_SIZE (8ull << 20) /* TCG's buffer is tb-size MiB; smaller rwx maps are not it */

/* The one anonymous private read-write-execute mapping of pid of at least
 * PF_MIN_SIZE: [*lo, *hi). 0, -ENOENT if there is none (KVM) or more than one
 * (not a layout this code knows), or -errno. */
static int tcg_buffer(pid_t pid, uint64_t *lo, uint64_t *hi)
{
    char path[48], *line = NULL;
    size_t cap = 0;
    unsigned found = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    if (!(f = fopen(path, "re")))
        return -errno;
    while (getline(&line, &cap, f) > 0) {
        unsigned long long a, b, off;
        char perms[8];
        unsigned maj, min;
        unsigned long ino;
        int end = 0;

        if (sscanf(line, "%llx-%llx %7s %llx %x:%x %lu%n", &a, &b, perms, &off, &maj, &min, &ino,
                   &end) < 7)
            continue;
        /* Anonymous: no path after the inode (a [heap] or [stack] has one). */
        while (line[end] == ' ')
            end++;
        if (strcmp(perms, "rwxp") != 0 || ino != 0 || (line[end] && line[end] != '\n') ||
            b - a < PF_MIN_SIZE)
            continue;
        *lo = a;
        *hi = b;
        found++;
    }
    free(line);
    fclose(f);
    return found == 1 ? 0 : -ENOENT;
}

int vmm_pf_open(pid_t pid, int pidfd, uint64_t bytes, struct vmm_pf *pf)
{
    char path[48];
    uint64_t lo = 0, hi = 0;
    int r;

    memset(pf, 0, sizeof(*pf));
    pf->mem = pf->pagemap = -1;
    if (bytes == 0)
        return -ENOENT;
    if ((r = tcg_buffer(pid, &lo, &hi)) != 0)
        return r;
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
    if ((pf->mem = open(path, O_RDWR | O_CLOEXEC)) < 0)
        goto fail;
    snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
    if ((pf->pagemap = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        goto fail;
    /* Both opened while the pidfd says the process lives: they are its files. */
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0)
        goto fail;
    pf->at = lo;
    pf->end = bytes < hi - lo ? lo + (bytes & ~(uint64_t)(PF_PAGE - 1)) : hi;
    return 0;
fail:
    r = -errno;
    vmm_pf_close(pf);
    return r;
}

int vmm_pf_step(struct vmm_pf *pf, unsigned pages)
{
    static const char zero[16 * PF_PAGE];
    uint64_t ent[64];
    unsigned n;
    ssize_t got;

    if (pf->mem < 0 || pf->at >= pf->end)
        return 0;
    if (pages > 64)
        pages = 64;
    n = (unsigned)((pf->end - pf->at) / PF_PAGE);
    if (n > pages)
        n = pages;
    got = pread(pf->pagemap, ent, n * sizeof(ent[0]), (off_t)(pf->at / PF_PAGE * sizeof(ent[0])));
    if (got < 0)
        return -errno;
    if (got < (ssize_t)(n * sizeof(ent[0])))
        return -EIO;
    /* Runs of absent pages, each written in one call. */
    for (unsigned i = 0; i < n;) {
        unsigned j = i;

        if (ent[i] & (PF_PRESENT | PF_SWAPPED)) {
            i++;
            continue;
        }
        while (j < n && j - i < sizeof(zero) / PF_PAGE && !(ent[j] & (PF_PRESENT | PF_SWAPPED)))
            j++;
        got = pwrite(pf->mem, zero, (size_t)(j - i) * PF_PAGE, (off_t)(pf->at + i * PF_PAGE));
        if (got < 0)
            return -errno;
        if (got != (ssize_t)((j - i) * PF_PAGE))
            return -EIO; /* the process is going: its mm is gone */
        pf->touched += (uint64_t)(j - i) * PF_PAGE;
        i = j;
    }
    pf->at += (uint64_t)n * PF_PAGE;
    return pf->at < pf->end;
}

void vmm_pf_close(struct vmm_pf *pf)
{
    if (pf->mem >= 0)
        close(pf->mem);
    if (pf->pagemap >= 0)
        close(pf->pagemap);
    pf->mem = pf->pagemap = -1;
}
