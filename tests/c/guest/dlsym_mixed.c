/* Registrations made through one entry point and released through the other: the program
 * is linked with libibverbs AND looks ibv_reg_mr/ibv_dereg_mr up through a dlopen handle
 * (as a plugin of a linked program would). Phase 1 registers through the dlsym'd pointer
 * and deregisters through the linked function, phase 2 the reverse, phase 3 alternates.
 * Every 50th registration must carry an RDMA WRITE; under the preload every registration
 * after the first must be a hit (the same lkey), and the PD must free cleanly at the end
 * (no registration leaked or deregistered twice).
 *
 *   dlsym_mixed [ITERATIONS per phase, default 500]
 */
#include "lib/loopback.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>

typedef struct ibv_mr *(*reg_fn)(struct ibv_pd *, void *, size_t, int);
typedef int (*dereg_fn)(struct ibv_mr *);

static struct ibv_mr *linked_reg(struct ibv_pd *pd, void *addr, size_t len, int access) {
    return ibv_reg_mr(pd, addr, len, access);
}

static int linked_dereg(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 500;
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    void *h = dlopen("libibverbs.so.1", RTLD_NOW);
    CHECK(h, "dlopen libibverbs.so.1: %s", dlerror());
    reg_fn dl_reg;
    dereg_fn dl_dereg;
    void *p = dlsym(h, "ibv_reg_mr");
    CHECK(p, "dlsym ibv_reg_mr: %s", dlerror());
    memcpy(&dl_reg, &p, sizeof p);
    p = dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
    CHECK(p, "dlvsym ibv_dereg_mr: %s", dlerror());
    memcpy(&dl_dereg, &p, sizeof p);

    size_t len = 256 << 10;
    char *buf = malloc(len);
    CHECK(buf, "malloc");
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    uint32_t first_lkey = 0;
    int same = 0, total = 0;
    static const char *phase_names[3] = {"dlsym'd reg, linked dereg",
                                         "linked reg, dlsym'd dereg", "alternating"};
    for (int phase = 0; phase < 3; phase++) {
        for (int i = 0; i < iters; i++) {
            int dl_first = phase == 0 || (phase == 2 && i % 2 == 0);
            struct ibv_mr *mr = dl_first ? dl_reg(lb.pd, buf, len, access)
                                         : linked_reg(lb.pd, buf, len, access);
            CHECK(mr, "%s: registration %d failed: %s", phase_names[phase], i, strerror(errno));
            CHECK(mr->addr == buf && mr->length == len && mr->pd == lb.pd,
                  "%s: MR fields wrong at %d", phase_names[phase], i);
            if (total == 0)
                first_lkey = mr->lkey;
            same += mr->lkey == first_lkey;
            total++;
            if (i % 50 == 0 || i == iters - 1)
                CHECK(lb_prove_write(&lb, mr, buf, len, (unsigned)(phase * iters + i)) == 0,
                      "%s: data did not land at %d", phase_names[phase], i);
            int rc = dl_first ? linked_dereg(mr) : dl_dereg(mr);
            CHECK(rc == 0, "%s: deregistration %d failed: %s", phase_names[phase], i,
                  strerror(rc));
        }
    }
    if (mrcache_loaded())
        CHECK(same == total, "only %d of %d registrations reused the cached MR", same, total);
    free(buf);
    lb_close(&lb);
    printf("dlsym_mixed: %d registrations, %d with the first lkey, preload %s\n", total, same,
           mrcache_loaded() ? "loaded" : "absent");
    return 0;
}
