/* remap_file_pages() over a registered shared file mapping. Since Linux 4.0
 * the kernel emulates it as mmap(MAP_FIXED) of the same file over the range: the range is
 * backed by other pages of the file from then on. A fake provider counts registrations
 * (libmrcache.so preloaded): register the mapping, release it (the cache keeps it), remap
 * it to other pages of the file, register it again: a second provider registration means
 * the call was reported; a cache hit means it was not (a stale registration on a real HCA:
 * RDMA would reach the file pages the range no longer shows).
 *   remap_file_pages      exit 0: reported; 1: not reported; 3: set-up failed;
 *                            77: remap_file_pages unsupported here */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGES 4

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

static int cycle(struct ibv_pd *pd, char *buf, size_t len) {
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    return !mr || ibv_dereg_mr(mr);
}

int main(void) {
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = PAGES * page;
    /* A file of twice the mapping: page i holds the byte 'a' + i. */
    int fd = memfd_create("remap_file_pages", 0);
    if (fd < 0 || ftruncate(fd, (off_t)(2 * len))) {
        perror("remap_file_pages: memfd");
        return 3;
    }
    char *file = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (file == MAP_FAILED) return 3;
    for (int i = 0; i < 2 * PAGES; i++) memset(file + i * page, 'a' + i, page);
    munmap(file, 2 * len);
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (buf == MAP_FAILED) return 3;
    if (cycle(&pd, buf, len) || cycle(&pd, buf, len) || registrations != 1) {
        fprintf(stderr, "remap_file_pages: the cache did not keep the registration (%d)\n",
                registrations);
        return 3;
    }
    /* The range now shows the file's second half. */
    if (remap_file_pages(buf, len, 0, PAGES, 0)) {
        fprintf(stderr, "remap_file_pages: unsupported here: %s\n", strerror(errno));
        return 77;
    }
    if (buf[0] != 'a' + PAGES) {
        fprintf(stderr, "remap_file_pages: the range still shows file page 0 ('%c')\n", buf[0]);
        return 3;
    }
    if (cycle(&pd, buf, len)) return 3;
    printf("remap_file_pages: %s\n",
           registrations == 2 ? "reported (registered again)" : "NOT reported (cache hit)");
    return registrations == 2 ? 0 : 1;
}
