/* The registration hook's full path reads the patched sites only
 * while the watch word is suspect. A write over our munmap jump that no watched call
 * announces (/proc/self/mem, or a raw syscall mprotect + store + raw mprotect back) leaves
 * the word clean; when every miss read the sites, the next full-path registration (a miss) read every site
 * and stopped caching; now the miss is cached, its memory goes away through the overwritten
 * munmap unseen, and the next registration of the address is a hit on the dead entry.
 *   overwrite_unannounced procmem   overwrite through /proc/self/mem
 *   overwrite_unannounced rawsys    syscall(SYS_mprotect) RW, store, syscall(SYS_mprotect) RX
 * exit 0: no stale hit (caching stopped at the miss); 1: stale hit served; 3: set-up. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LEN 4096ul
static int registrations;
static struct ibv_pd pd;

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    registrations++;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

/* Our jump in libc's munmap: on x86-64 a `jmp rel8` over the `syscall` after `mov eax, 11`
 * (or a `jmp rel32` over the first instruction; after an endbr64, if any), a `B` over the
 * first instruction on aarch64. */
static unsigned char *our_jump(void) {
    unsigned char *f = dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), "munmap");
#if defined(__aarch64__)
    uint32_t insn = 0;
    if (f) memcpy(&insn, f, 4);
    return f && (insn & 0xfc000000u) == 0x14000000u ? f : NULL;
#else
    static const int sites[] = {0, 4, 5, 9};
    for (unsigned k = 0; f && k < sizeof sites / sizeof *sites; k++)
        if (f[sites[k]] == 0xe9 || f[sites[k]] == 0xeb) return f + sites[k];
    return NULL;
#endif
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    int (*watch_clean)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "mrcache_patch_watch_clean");
    int *shim_regs = dlsym(RTLD_DEFAULT, "shim_regs");
    char *a = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 3; i++) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, a, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (!mr || ibv_dereg_mr(mr)) return 3;
    }
    /* libc is patched at the first registration. */
    unsigned char *jump = our_jump();
    if (!watch_clean || !shim_regs || !jump) {
        fprintf(stderr, "overwrite_unannounced: set-up (watch %p shim %p jump %p)\n", (void *)watch_clean,
                (void *)shim_regs, (void *)jump);
        return 3;
    }
    int clean = 0;
    for (int i = 0; i < 500 && !(clean = watch_clean()); i++) usleep(10000);
    if (!clean) {
        fprintf(stderr, "overwrite_unannounced: the watch never cleared\n");
        return 3;
    }
    /* Another patcher's munmap (the memory goes, nothing sees it): mov eax, 11; syscall; ret
     * on x86-64, mov x8, #215; svc #0; ret on aarch64. */
#if defined(__aarch64__)
    static const unsigned char stub[12] = {0xe8, 0x1a, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4, 0xc0, 0x03, 0x5f, 0xd6};
#else
    static const unsigned char stub[8] = {0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0xc3};
#endif
    size_t page_size = (size_t)sysconf(_SC_PAGESIZE);
    void *page = (void *)((uintptr_t)jump & ~(uintptr_t)(page_size - 1));
    if (!strcmp(argv[1], "procmem")) {
        int fd = open("/proc/self/mem", O_RDWR);
        if (fd < 0 || pwrite(fd, stub, sizeof stub, (off_t)(uintptr_t)jump) != sizeof stub) {
            perror("overwrite_unannounced: /proc/self/mem");
            return 3;
        }
        close(fd);
    } else {
        if (syscall(SYS_mprotect, page, 2 * page_size, PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        memcpy(jump, stub, sizeof stub);
        __builtin___clear_cache((char *)jump, (char *)jump + sizeof stub);
        if (syscall(SYS_mprotect, page, 2 * page_size, PROT_READ | PROT_EXEC)) return 3;
    }
#if defined(__aarch64__)
    int (*libc_munmap)(void *, size_t) = (int (*)(void *, size_t))(uintptr_t)jump;
#else
    int (*libc_munmap)(void *, size_t) = (int (*)(void *, size_t))(uintptr_t)(jump - (jump[-4] == 0xf3 ? 4 : 0));
#endif
    /* A miss right after (well inside the drain's 20 ms cycle). */
    char *c = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int regs0 = registrations, shim0 = *shim_regs, watch_at_miss = watch_clean();
    struct ibv_mr *m1 = ibv_reg_mr(&pd, c, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!m1 || ibv_dereg_mr(m1)) return 3;
    (void)regs0, (void)shim0;
    /* Freed through libc's entry (as glibc's free of an mmapped chunk does): unseen now. */
    if (libc_munmap(c, LEN)) return 3;
    /* Other memory at the same address, past every hook. */
    char *again = (char *)syscall(SYS_mmap, c, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (again != c) return 3;
    int regs1 = registrations, shim1 = *shim_regs;
    struct ibv_mr *m2 = ibv_reg_mr(&pd, c, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!m2) return 3;
    int hit = m2 == m1 && registrations == regs1 && *shim_regs == shim1;
    printf("%s: watch clean at the miss: %d; the registration after the unseen unmap: %s\n",
           argv[1], watch_at_miss, hit ? "a HIT on the dead entry (stale)" : "not a hit");
    return hit ? 1 : 0;
}
