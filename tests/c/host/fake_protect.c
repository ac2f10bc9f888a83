/* A protection change that takes write access away drops the cached registrations of the
 * range, checked on the host without RDMA: a fake provider refuses to pin for writing a
 * page the process cannot write (errno EFAULT, as the kernel's pin_user_pages does) and
 * counts registrations. Register a 64 KiB buffer for local write, release it (the cache
 * keeps it), make it read-only one way, register it again: EFAULT, as without the cache; a
 * registration handed out means a cache hit on pages the NIC must not write.
 *   fake_protect mprotect|pkey_mprotect|libc_mprotect
 *       exit 0: refused with EFAULT; 1: a registration was handed out
 *   fake_protect storm N
 *       N reg/dereg pairs of the buffer, each after toggling another page RW -> RX -> RW
 *       (a JIT's code page), the pairs alone timed against N pairs without the toggles
 *       (clock reads included); prints the
 *       registrations the provider saw: 1 when every pair after the first was a hit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int registrations;

/* Whether every page of [addr, addr + len) is mapped writable, from /proc/self/maps. */
static int writable(void *addr, size_t len) {
    static char maps[1 << 16];
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0) return 0;
    size_t n = 0;
    ssize_t r;
    while (n < sizeof maps - 1 && (r = read(fd, maps + n, sizeof maps - 1 - n)) > 0) n += (size_t)r;
    close(fd);
    maps[n] = 0;
    unsigned long lo = (unsigned long)addr, hi = lo + len, covered = lo;
    for (char *l = maps; *l && covered < hi;) {
        unsigned long s, e;
        char perms[5];
        if (sscanf(l, "%lx-%lx %4s", &s, &e, perms) == 3 && s <= covered && covered < e) {
            if (perms[1] != 'w') return 0;
            covered = e;
        }
        char *nl = strchr(l, '\n');
        if (!nl) break;
        l = nl + 1;
    }
    return covered >= hi;
}

static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    int write = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if ((access & write) && !writable(addr, len)) {
        errno = EFAULT;
        return NULL;
    }
    registrations++;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    if (mr) mr->addr = addr, mr->length = len, mr->pd = pd, mr->context = pd->context;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    size_t len = 64 << 10;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 3;
    memset(buf, 1, len);
    int access = IBV_ACCESS_LOCAL_WRITE;
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, access);
    if (!mr || ibv_dereg_mr(mr)) return 3;

    if (!strcmp(argv[1], "storm")) {
        int n = argc > 2 ? atoi(argv[2]) : 10000;
        char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (code == MAP_FAILED) return 3;
        double t[2];
        for (int storm = 0; storm < 2; storm++) {
            double spent = 0;
            for (int i = 0; i < n; i++) {
                if (storm && (mprotect(code, 4096, PROT_READ | PROT_EXEC) ||
                              mprotect(code, 4096, PROT_READ | PROT_WRITE)))
                    return 3;
                double t0 = now();
                mr = ibv_reg_mr(&pd, buf, len, access);
                if (!mr || ibv_dereg_mr(mr)) return 3;
                spent += now() - t0;
            }
            t[storm] = spent / n;
        }
        printf("storm: %d pairs: %.0f ns a pair (with 2 mprotect of another page: %.0f ns); "
               "registrations %d\n", n, t[0], t[1], registrations);
        return 0;
    }

    int rc;
    if (!strcmp(argv[1], "mprotect")) {
        rc = mprotect(buf, len, PROT_READ);
    } else if (!strcmp(argv[1], "pkey_mprotect")) {
        rc = pkey_mprotect(buf, len, PROT_READ, -1);
    } else if (!strcmp(argv[1], "libc_mprotect")) {
        /* libc's own entry (glibc's internal __mprotect callers reach the same code). */
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        int (*f)(void *, size_t, int) = libc ? (int (*)(void *, size_t, int))dlsym(libc, "mprotect") : NULL;
        if (!f) return 3;
        rc = f(buf, len, PROT_READ);
    } else {
        return 2;
    }
    if (rc) {
        perror("fake_protect: mprotect");
        return 3;
    }
    /* The fake models the kernel: the provider itself refuses (libibverbs cannot run the fake
     * context without libmrcache.so, so this stands for the run without the cache). */
    int before = registrations;
    if (fake_reg(&pd, buf, len, (uintptr_t)buf, access) || errno != EFAULT || registrations != before) {
        printf("%s: the fake provider pinned a read-only buffer for write\n", argv[1]);
        return 3;
    }
    errno = 0;
    mr = ibv_reg_mr(&pd, buf, len, access);
    if (mr) {
        printf("%s: a registration for write of a read-only buffer was handed out (%d provider "
               "registrations: %s)\n",
               argv[1], registrations, registrations == 1 ? "a cache hit" : "?");
        return 1;
    }
    if (errno != EFAULT) {
        printf("%s: refused with errno %d, not EFAULT\n", argv[1], errno);
        return 3;
    }
    printf("%s: refused with EFAULT, as without the cache\n", argv[1]);
    return 0;
}
