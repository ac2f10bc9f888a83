/* A memory hook checked on the host, without RDMA: a fake provider (ibv_context ops that
 * count registrations), libmrcache.so preloaded. Register a buffer, release it (the cache
 * keeps it), zap its pages one way, register it again: a second provider registration
 * means the hook reported the zap; a cache hit means it did not (a stale registration on a
 * real HCA).
 *   fake_zap process_madvise|guard     exit 0: reported; 1: not reported; 77: unsupported */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#define MADV_GUARD_REMOVE 103
#endif

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

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    size_t len = 4 * 4096;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, len);
    int access = IBV_ACCESS_LOCAL_WRITE;
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, access);
    if (!mr || ibv_dereg_mr(mr)) return 3;
    mr = ibv_reg_mr(&pd, buf, len, access);
    if (!mr || ibv_dereg_mr(mr) || registrations != 1) {
        fprintf(stderr, "fake_zap: the cache did not keep the registration (%d)\n", registrations);
        return 3;
    }
    if (!strcmp(argv[1], "process_madvise")) {
        int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
        struct iovec v = {buf, len};
        if (pidfd < 0 || process_madvise(pidfd, &v, 1, MADV_DONTNEED, 0) != (ssize_t)len) {
            fprintf(stderr, "fake_zap: process_madvise(self, DONTNEED) unsupported here: %s\n", strerror(errno));
            return 77;
        }
    } else if (!strcmp(argv[1], "guard")) {
        if (madvise(buf, len, MADV_GUARD_INSTALL) || madvise(buf, len, MADV_GUARD_REMOVE)) {
            fprintf(stderr, "fake_zap: MADV_GUARD_INSTALL unsupported here: %s\n", strerror(errno));
            return 77;
        }
    } else {
        return 2;
    }
    mr = ibv_reg_mr(&pd, buf, len, access);
    if (!mr || ibv_dereg_mr(mr)) return 3;
    printf("%s: %s\n", argv[1], registrations == 2 ? "reported (registered again)" : "NOT reported (cache hit)");
    return registrations == 2 ? 0 : 1;
}
