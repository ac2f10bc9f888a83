/* Where an RDMA WRITE into an on-demand registration lands: 64 bytes sent at offset 100 of
 * a fresh ON_DEMAND registration of three pages, then 64 at offset 4096 (a page boundary,
 * which must land, else the probe says nothing), each looked for in the whole buffer.
 * Prints one line per write ("sent N landed M", M "nowhere") and then "offsets kept" or
 * "offsets misplaced"; exits 3 where the device refuses an on-demand registration, 1 on a
 * failed write or a page-boundary write that did not land. The check beside the bench's own
 * (cli/src/bench/odp/offsets.rs), on the test helper's pair of queue pairs. */
#include "lib/loopback.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#define LEN 64
#define PAGE 4096
#define PAGES 3
#define BACKGROUND 0xa5

static long find(const unsigned char *mem, size_t len, const unsigned char *pat) {
    for (size_t i = 0; i + LEN <= len; i++)
        if (memcmp(mem + i, pat, LEN) == 0)
            return (long)i;
    return -1;
}

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    size_t len = PAGES * PAGE;
    unsigned char *dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(dst != MAP_FAILED, "mmap failed");
    memset(dst, BACKGROUND, len);
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, dst, len,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_ON_DEMAND);
    if (!mr) {
        printf("odp_offset: the device refuses an on-demand registration (%s)\n", strerror(errno));
        return 3;
    }
    size_t sent[2] = {100, PAGE};
    long landed[2];
    for (int k = 0; k < 2; k++) {
        unsigned char pat[LEN];
        for (int i = 0; i < LEN; i++)
            pat[i] = (unsigned char)(0x10 + 16 * k + 3 * i) | 0x01;
        memcpy(lb.stage, pat, LEN);
        int rc = lb_write(&lb, lb.stage, LEN, lb.stage_mr->lkey, (uintptr_t)(dst + sent[k]),
                          mr->rkey);
        CHECK(rc == 0, "the RDMA WRITE to offset %zu failed: %d", sent[k], rc);
        landed[k] = find(dst, len, pat);
        if (landed[k] < 0)
            printf("odp_offset: sent %zu landed nowhere\n", sent[k]);
        else
            printf("odp_offset: sent %zu landed %ld\n", sent[k], landed[k]);
    }
    CHECK(landed[1] == PAGE, "the write at the page boundary did not land there: the probe "
                             "cannot tell");
    int untouched = 1;
    for (size_t i = 0; i < 100; i++)
        untouched &= dst[i] == BACKGROUND;
    printf("odp_offset: offsets %s\n", landed[0] == 100 && untouched ? "kept" : "misplaced");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr failed");
    munmap(dst, len);
    lb_close(&lb);
    return 0;
}
