/* The preload's hit fast path keeps the full path's guarantees, checked on the host with a
 * fake provider (ibv_context ops that track the objects they hand out) and, behind
 * libmrcache.so, verbs_shim.so (libibverbs' reg/dereg for calls passed through).
 *   fast_hit nested      a registration (and its deregistration) the provider makes inside
 *                        our miss path passes through, never served from the cache
 *   fast_hit fork_flush  with MRCACHE_FORK=flush, the first registration after _Fork()
 *                        does not hit the idle entry the fork must flush
 *   fast_hit patch_overwrite  our jump in libc's munmap replaced by another between two
 *                        hits: the registration after it is not a hit (caching stops)
 *   fast_hit double_dereg  a second ibv_dereg_mr of an MR released on the fast path, and
 *                        of one whose memory went away, is EINVAL, never the provider's
 * exit 0: kept; 1: broken (printed); 3: set-up failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern pid_t _Fork(void);

#define LEN 4096ul
#define LIVE 64
static struct ibv_mr *live[LIVE];
static int registrations;
static char *nest_in, *nest_on; /* a miss on nest_in registers nest_on from inside */
static struct ibv_mr *nested_mr;
static struct ibv_pd pd;

static int is_live(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (mr && live[i] == mr) return 1;
    return 0;
}

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)len, (void)iova;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    for (int i = 0; i < LIVE; i++)
        if (!live[i]) {
            live[i] = mr;
            break;
        }
    registrations++;
    if (nest_in && addr == nest_in) {
        /* As a provider that registers a buffer of its own through the public API. */
        nested_mr = ibv_reg_mr(&pd, nest_on, LEN, access);
        if (nested_mr && ibv_dereg_mr(nested_mr)) nested_mr = NULL;
    }
    return mr;
}

static int fake_dereg(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (live[i] == mr) {
            live[i] = NULL;
            free(mr);
            return 0;
        }
    fprintf(stderr, "fast_hit: the provider was asked to deregister %p, not one of its own\n", (void *)mr);
    exit(1);
}

/* reg+dereg of buf: the MR handed out. */
static struct ibv_mr *cycle(char *buf) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || ibv_dereg_mr(mr)) {
        fprintf(stderr, "fast_hit: reg/dereg failed\n");
        exit(3);
    }
    return mr;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    char *bufs = mmap(NULL, 4 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a = bufs, *b = bufs + 2 * LEN;
    /* Miss, hit on the full path (which opens the fast one), hit on the fast path. */
    struct ibv_mr *cached = cycle(b);
    if (cycle(b) != cached || cycle(b) != cached || registrations != 1) {
        fprintf(stderr, "fast_hit: the cache did not keep the registration\n");
        return 3;
    }
    if (!strcmp(argv[1], "nested")) {
        int *shim_regs = dlsym(RTLD_DEFAULT, "shim_regs"), *shim_deregs = dlsym(RTLD_DEFAULT, "shim_deregs");
        if (!shim_regs || !shim_deregs) {
            fprintf(stderr, "fast_hit: verbs_shim.so is not preloaded\n");
            return 3;
        }
        nest_in = a, nest_on = b;
        cycle(a);
        nest_in = NULL;
        if (nested_mr == cached) {
            fprintf(stderr, "fast_hit: a registration nested in our miss path was served from the cache\n");
            return 1;
        }
        if (!nested_mr || *shim_regs != 1 || *shim_deregs != 1) {
            fprintf(stderr, "fast_hit: nested reg/dereg went different ways: %p, %d registrations and %d deregistrations passed through\n",
                    (void *)nested_mr, *shim_regs, *shim_deregs);
            return 1;
        }
        if (cycle(b) != cached || !is_live(cached)) {
            fprintf(stderr, "fast_hit: the cached registration was lost (live: %d)\n", is_live(cached));
            return 1;
        }
        printf("nested: passed through, cache intact\n");
        return 0;
    }
    if (!strcmp(argv[1], "fork_flush")) {
        /* Rounds, because the background drain (every 20 ms) may flush the entry first and
         * hide a hit; with the fast path shut as it must be, every round misses. */
        for (int round = 0; round < 20; round++) {
            int before = registrations;
            pid_t pid = _Fork();
            if (pid == 0) _exit(0);
            if (pid < 0) return 3;
            cycle(b);
            if (registrations != before + 1) {
                fprintf(stderr, "fast_hit: round %d: the first registration after _Fork() hit the idle entry the fork had to flush\n", round);
                return 1;
            }
            if (waitpid(pid, NULL, 0) != pid) return 3;
            /* Cached again and hit on the full path, which opens the fast one. */
            cycle(b), cycle(b);
        }
        printf("fork_flush: flushed every time, registered again\n");
        return 0;
    }
    if (!strcmp(argv[1], "patch_overwrite")) {
        /* Our jump (ff 25, 0 displacement, then the hook's address) at munmap's entry or
         * after its endbr64, replaced as another patcher would: here by a jump of another
         * form to the same hook (movabs rax, hook; jmp rax), so a munmap call on any thread
         * still works, and it stays. */
        unsigned char *f = dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), "munmap");
        static const unsigned char head[6] = {0xff, 0x25, 0, 0, 0, 0};
        unsigned char *jump = NULL;
        for (int at = 0; f && at <= 4 && !jump; at += 4)
            if (!memcmp(f + at, head, 6)) jump = f + at;
        if (!jump) {
            printf("patch_overwrite: munmap is not patched here (the self-test reports it); skipped\n");
            return 0;
        }
        uintptr_t page = (uintptr_t)jump & ~(uintptr_t)4095;
        if (mprotect((void *)page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        unsigned char other[12] = {0x48, 0xb8};
        memcpy(other + 2, jump + 6, 8);
        other[10] = 0xff, other[11] = 0xe0;
        memcpy(jump, other, sizeof other);
        __builtin___clear_cache((char *)jump, (char *)jump + sizeof other);
        struct ibv_mr *after = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (after == cached) {
            fprintf(stderr, "fast_hit: a hit after our munmap jump was overwritten: served blind\n");
            return 1;
        }
        if (!after || ibv_dereg_mr(after)) return 3;
        printf("patch_overwrite: noticed before the hit\n");
        return 0;
    }
    if (!strcmp(argv[1], "double_dereg")) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        int first = ibv_dereg_mr(mr), second = ibv_dereg_mr(mr);
        if (mr != cached || first != 0 || second != EINVAL || !is_live(cached)) {
            fprintf(stderr, "fast_hit: reg+dereg+dereg of a cached MR: %s, %d, %d (live: %d)\n",
                    mr == cached ? "hit" : "not a hit", first, second, is_live(cached));
            return 1;
        }
        /* Held while its memory goes away, released (the provider deregisters it), then
         * released again: the cache remembers it, the provider is not asked twice. */
        mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (munmap(bufs, 4 * LEN)) return 3;
        first = ibv_dereg_mr(mr), second = ibv_dereg_mr(mr);
        if (first != 0 || second != EINVAL) {
            fprintf(stderr, "fast_hit: dereg, dereg of an MR whose memory went away: %d, %d\n", first, second);
            return 1;
        }
        printf("double_dereg: EINVAL, provider not asked\n");
        return 0;
    }
    return 2;
}
