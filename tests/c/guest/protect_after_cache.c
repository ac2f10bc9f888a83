/* A buffer registered for write, released (the cache keeps it), then made read-only with
 * mprotect: registering it again for write fails with EFAULT, as with libibverbs alone
 * (the kernel will not pin for writing a page the process cannot write). A registration
 * handed out instead is a cache hit on pages pinned writable: an RDMA READ through its
 * lkey writes the read-only page (said, and exit 1). After mprotect back to read+write, a registration works
 * and an RDMA WRITE lands.
 *   protect_after_cache local|remote   (LOCAL_WRITE, or LOCAL_WRITE | REMOTE_WRITE) */
#include "lib/loopback.h"
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#define LEN (64u << 10)

int main(int argc, char **argv) {
    CHECK(argc == 2 && (!strcmp(argv[1], "local") || !strcmp(argv[1], "remote")), "usage: protect_after_cache local|remote");
    int access = IBV_ACCESS_LOCAL_WRITE | (!strcmp(argv[1], "remote") ? IBV_ACCESS_REMOTE_WRITE : 0);
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    unsigned char *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(buf != MAP_FAILED, "mmap");
    lb_fill(buf, LEN, 1);
    for (int i = 0; i < 2; i++) {
        struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, LEN, access);
        CHECK(mr, "reg %d (errno %d)", i, errno);
        CHECK(ibv_dereg_mr(mr) == 0, "dereg %d", i);
    }
    CHECK(mprotect(buf, LEN, PROT_READ) == 0, "mprotect PROT_READ (errno %d)", errno);
    errno = 0;
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, LEN, access);
    if (mr) {
        unsigned char *src = malloc(LEN);
        CHECK(src, "malloc");
        lb_fill(src, LEN, 2);
        struct ibv_mr *src_mr = ibv_reg_mr(lb.pd, src, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        CHECK(src_mr, "reg of the READ's source (errno %d)", errno);
        int rc = lb_read(&lb, buf, LEN, mr->lkey, (uintptr_t)src, src_mr->rkey);
        fprintf(stderr, "FAIL: a registration for write of a read-only buffer was handed out; an RDMA READ into it: %d, the read-only page %s\n",
                rc, lb_check(buf, LEN, 2) < 0 ? "WRITTEN by the NIC" : "unchanged");
        return 1;
    }
    CHECK(errno == EFAULT, "registration of the read-only buffer failed with errno %d, not EFAULT", errno);
    CHECK(mprotect(buf, LEN, PROT_READ | PROT_WRITE) == 0, "mprotect back (errno %d)", errno);
    mr = ibv_reg_mr(lb.pd, buf, LEN, access | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr, "reg after mprotect back (errno %d)", errno);
    CHECK(lb_prove_write(&lb, mr, buf, LEN, 3) == 0, "write after mprotect back");
    CHECK(ibv_dereg_mr(mr) == 0, "dereg");
    lb_close(&lb);
    printf("protect_after_cache %s: EFAULT after mprotect(PROT_READ), as libibverbs alone\n", argv[1]);
    return 0;
}
