/* Register and deregister the same buffer 10,000 times (reg_loop [ITERATIONS [KIB]]); every
 * 100th registration must still carry an RDMA WRITE into the buffer. Under the preload, every registration after the
 * first must be a hit (the same lkey), and the data must still land. */
#include "lib/loopback.h"

#include <string.h>

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10000;
    /* The buffer in KiB (default 256). */
    size_t len = (argc > 2 ? (size_t)atol(argv[2]) : 256) << 10;
    CHECK(len > 0, "usage: reg_loop [ITERATIONS [KIB]]");
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    char *buf = malloc(len);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    uint32_t first_lkey = 0;
    int same = 0;
    for (int i = 0; i < iters; i++) {
        struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, len, access);
        CHECK(mr, "ibv_reg_mr failed at iteration %d", i);
        CHECK(mr->addr == buf && mr->length == len && mr->pd == lb.pd, "MR fields wrong at %d", i);
        if (i == 0)
            first_lkey = mr->lkey;
        same += mr->lkey == first_lkey;
        if (i % 100 == 0 || i == iters - 1)
            CHECK(lb_prove_write(&lb, mr, buf, len, (unsigned)i) == 0, "data did not land at iteration %d", i);
        CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr failed at iteration %d", i);
    }
    /* MRCACHE_TEST_EXPECT_HITS=0: the preload is loaded but the cache must be off; =most:
     * at least 95% of the registrations reuse the cached MR (the default admission passes a
     * cached remote class's hits through now and then, in bursts of 4, to time a miss: 16
     * of 500 calls, 32 of 10000; a class that flipped to pass-through reuses far fewer). */
    const char *expect = getenv("MRCACHE_TEST_EXPECT_HITS");
    int want_hits = mrcache_loaded() && !(expect && !strcmp(expect, "0"));
    if (want_hits && expect && !strcmp(expect, "most"))
        CHECK(same * 100 >= iters * 95, "only %d of %d registrations reused the cached MR (want 95%%)",
              same, iters);
    else if (want_hits)
        CHECK(same == iters, "only %d of %d registrations reused the cached MR", same, iters);
    else if (mrcache_loaded())
        CHECK(same < iters, "all %d registrations reused one MR, yet the cache should be off", iters);
    free(buf);
    lb_close(&lb);
    printf("reg_loop: %d iterations, %d with the first lkey, preload %s\n", iters, same,
           mrcache_loaded() ? "loaded" : "absent");
    return 0;
}
