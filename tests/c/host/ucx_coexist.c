/* mrcache and UCX's memory hooks in one process, on the host (no RDMA): a fake provider
 * (ibv_context ops that count registrations), libmrcache.so preloaded, UCM's hooks
 * installed (ucx/ucm_watch.c). For one way memory goes away: register a buffer twice
 * (the second must be a hit: caching is on), release it, make the memory go away, register
 * again. mrcache saw it when the provider registers anew; UCX saw it when its VM_UNMAPPED
 * handler got an event for the range.
 *   ucx_coexist munmap|madvise|mremap|shmdt|free
 * Exit 0: both saw it; 1: mrcache did not; 2: UCX did not; 3: neither; 4: UCM would not
 * install; 5: caching was off. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

extern char *ucm_watch_lo, *ucm_watch_hi;
extern int ucm_watch_events;
int ucm_watch_install(void);

static int registrations;
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)addr, (void)len, (void)iova, (void)access;
    registrations++;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

static struct ibv_pd pd;

static void reg_release(void *buf, size_t len) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) {
        fprintf(stderr, "ibv_reg_mr failed\n");
        exit(6);
    }
    ibv_dereg_mr(mr);
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 7;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))(void (*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))(void (*)(void))fake_dereg;
    pd.context = &ctx;
    const char *early = getenv("UCM_WATCH_EARLY");
    if (!(early && *early == '1') && ucm_watch_install() != 0) {
        fprintf(stderr, "FAIL: UCM could not install its memory hooks\n");
        return 4;
    }
    const char *s = argv[1];
    size_t len = 1 << 20;
    int shmid = -1;
    char *buf;
    if (!strcmp(s, "shmdt")) {
        shmid = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
        buf = shmat(shmid, NULL, 0);
    } else if (!strcmp(s, "free")) {
        len = 40 << 20; /* above glibc's mmap threshold: free() unmaps it inside libc */
        buf = malloc(len);
    } else {
        buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (!buf || buf == MAP_FAILED)
        return 8;
    memset(buf, 1, len);
    ucm_watch_lo = buf;
    ucm_watch_hi = buf + len;
    reg_release(buf, len);
    int before = registrations;
    reg_release(buf, len);
    if (registrations != before) {
        printf("%s: caching is off (the second registration was not a hit)\n", s);
        return 5;
    }
    if (!strcmp(s, "munmap"))
        munmap(buf, len);
    else if (!strcmp(s, "madvise"))
        madvise(buf, len, MADV_DONTNEED);
    else if (!strcmp(s, "mremap"))
        mremap(buf, len, 2 * len, MREMAP_MAYMOVE);
    else if (!strcmp(s, "shmdt")) {
        shmdt(buf);
        shmctl(shmid, IPC_RMID, NULL);
    } else if (!strcmp(s, "free"))
        free(buf);
    else
        return 7;
    /* The same addresses again, without anything that unmaps (free: the fake provider
     * registers any range, and the block may already be reused). */
    if (strcmp(s, "madvise") && strcmp(s, "free") &&
        mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
             0) != buf) {
        printf("%s: the range could not be mapped again (skipped)\n", s);
        return 9;
    }
    before = registrations;
    reg_release(buf, len);
    int mrcache_saw = registrations > before;
    int ucx_saw = ucm_watch_events > 0;
    printf("%s: mrcache %s, UCX %s (%d events)\n", s, mrcache_saw ? "saw it" : "MISSED",
           ucx_saw ? "saw it" : "MISSED", ucm_watch_events);
    return (mrcache_saw ? 0 : 1) | (ucx_saw ? 0 : 2);
}
