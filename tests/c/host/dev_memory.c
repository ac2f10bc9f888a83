/* Registrations of memory the CPU cannot read are passed to libibverbs uncached: a fake
 * provider that accepts any address (as a peer-memory client such as nvidia-peermem does
 * for GPU memory) counts the registrations that reach it; behind libmrcache.so and
 * verbs_shim.so (which hands passed-through registrations to the same provider).
 *   dev_memory prot_none   64 KiB inside a PROT_NONE reservation (how CUDA reserves VA)
 *   dev_memory unmapped    64 KiB where nothing is mapped
 *   dev_memory vvar        the first page of [vvar], the kernel's VM_IO|VM_PFNMAP mapping
 *                          (readable by the CPU, refused by get_user_pages, as a device's)
 *   dev_memory readable    64 KiB of ordinary memory (the control: the second is a hit)
 * Each registers and deregisters the range twice and prints how many registrations
 * reached the provider. exit 0: as expected (2, 2, 2, 1); 1: not (printed); 3: set-up; 77: no [vvar] here, or
 * (prot_none) no process_vm_readv. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <errno.h>
#include <unistd.h>

static int registrations;
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)iova, (void)access;
    registrations++;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->addr = addr, mr->length = len;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    /* One registration first, of ordinary memory: the library sets itself up (its tables,
     * its thread) before the scenario's hole is made, or that could reuse the hole. */
    static char warm[4096];
    struct ibv_mr *w = ibv_reg_mr(&pd, warm, sizeof warm, IBV_ACCESS_LOCAL_WRITE);
    if (!w || ibv_dereg_mr(w)) return 3;
    registrations = 0;
    size_t span = 1 << 20, len = 64 * 1024;
    char *base;
    int want;
    if (!strcmp(argv[1], "prot_none")) {
        /* Only process_vm_readv tells PROT_NONE from readable memory; where it is refused
         * the library takes the range as readable, as documented (docs/design/monitor.md, "Device
         * memory"). qemu-user does not implement it (ENOSYS): nothing to check there. */
        char probe = 0, one = 1;
        struct iovec l = {&probe, 1}, r = {&one, 1};
        if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1 && errno == ENOSYS) {
            fprintf(stderr, "dev_memory prot_none: process_vm_readv is not implemented here (qemu-user)\n");
            return 77;
        }
        base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        want = 2;
    } else if (!strcmp(argv[1], "unmapped")) {
        base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED || munmap(base, span)) return 3;
        want = 2;
    } else if (!strcmp(argv[1], "vvar")) {
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        unsigned long lo = 0;
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, "[vvar]")) {
                lo = strtoul(line, NULL, 16);
                break;
            }
        if (f) fclose(f);
        if (!lo) {
            fprintf(stderr, "dev_memory vvar: no [vvar] mapping here\n");
            return 77;
        }
        base = (char *)lo - 256 * 1024, len = 4096;
        want = 2;
    } else if (!strcmp(argv[1], "readable")) {
        base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base != MAP_FAILED) memset(base, 1, span);
        want = 1;
    } else {
        return 2;
    }
    if (base == MAP_FAILED) return 3;
    char *buf = base + 256 * 1024;
    for (int i = 0; i < 2; i++) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
        if (!mr || ibv_dereg_mr(mr)) {
            fprintf(stderr, "dev_memory %s: registration %d failed\n", argv[1], i);
            return 3;
        }
    }
    printf("dev_memory %s: %d registrations reached the provider (want %d)\n", argv[1], registrations, want);
    return registrations == want ? 0 : 1;
}
