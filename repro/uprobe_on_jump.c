/* A uprobe on the instruction our jump replaced (mremap+4, mmap+3, sbrk+2 in glibc 2.36:
 * the entry's second instruction) while libmrcache.so has patched libc: the kernel writes
 * its int3 over our jump's first byte, and a call through libc's entry then runs the
 * file's instruction out of line and goes on in libc, past our hook. Is it seen before a
 * hit? Runs with a private copy of libc (LD_LIBRARY_PATH=dir of the copy, UPROBE_LIBC=its
 * path), the probe for this process only (perf_event_open, uprobe PMU).
 *   uprobe_on_jump mremap  a buffer cached idle (and hit once), the probe attached at
 *                          mremap+4, the buffer moved away with libc's mremap
 *                          (MREMAP_FIXED), then registered again at its old address,
 *                          where nothing is mapped: "stale" when that is a hit.
 * exit 0 held, 1 stale, 3 set-up, 77 skipped. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int regs;
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    regs++;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) { free(mr); return 0; }
static struct ibv_context ctx;
static struct ibv_pd pd;

static uintptr_t want_addr, found_off;
static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + p->p_vaddr;
        if (p->p_type == PT_LOAD && want_addr >= lo && want_addr < lo + p->p_memsz) {
            found_off = want_addr - lo + p->p_offset;
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    void *(*libc_mremap)(void *, size_t, size_t, int, ...) = dlsym(libc, "mremap");
    Dl_info info;
    char path[4096];
    if (!libc_mremap || !dladdr((void *)libc_mremap, &info) || !realpath(info.dli_fname, path)) return 3;
    const char *want = getenv("UPROBE_LIBC");
    if (!want || strcmp(want, path)) { fprintf(stderr, "libc is %s, not the copy\n", path); return 3; }
    size_t len = 1 << 20;
    char *arena = mmap(NULL, 4 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(arena, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    memset(b, 1, len);
    /* 300 ms of hits, one every 5 ms: the drain's cycles (inline, no threads here) find
     * the patched pages unchanged and clean the watch word. */
    for (int k = 0; k < 60; k++) {
        struct ibv_mr *m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
        usleep(5000);
    }
    /* A call after a pause: due, it runs the drain's cycle (its check of every site) now;
     * the next is due 20 ms later. */
    usleep(30000);
    struct ibv_mr *m0 = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
    if (!m0 || ibv_dereg_mr(m0)) return 3;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned char *e = (unsigned char *)libc_mremap;
    printf("mremap entry %02x %02x %02x %02x | %02x %02x %02x %02x %02x (regs %d)\n", e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], regs);
    want_addr = (uintptr_t)e + 4;
    if (!dl_iterate_phdr(phdr_cb, NULL)) return 3;
    FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int type = -1;
    if (!f || fscanf(f, "%d", &type) != 1) { printf("skipped: no uprobe PMU\n"); return 77; }
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = type;
    a.config1 = (uint64_t)(uintptr_t)want;
    a.config2 = found_off;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) { printf("skipped: perf_event_open: %s\n", strerror(errno)); return 77; }
    printf("probe at mremap+4: entry %02x %02x %02x %02x | %02x %02x %02x %02x %02x\n", e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]);
    /* Registrations meanwhile (hits), as a program going on. */
    for (int k = 0; k < 3; k++) {
        struct ibv_mr *m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
    }
    int before = regs;
    char *moved = libc_mremap(b, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, arena + 2 * len);
    if (moved != arena + 2 * len) { printf("mremap: %s\n", strerror(errno)); return 3; }
    unsigned char vec;
    int gone = mincore(b, 4096, &vec) != 0 && errno == ENOMEM;
    struct ibv_mr *m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
    int hit = m && regs == before;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%ld us from the cycle's call to the registration\n", (t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000);
    printf("after libc's mremap moved it (old range unmapped: %d): registration at the old address %s\n",
           gone, hit ? "a HIT (stale: nothing is mapped there)" : "a miss");
    close(fd);
    return hit ? 1 : 0;
}
