/* Bad registration input behaves exactly as libibverbs alone does: the same success or
 * failure and the same errno, compared call by call with libibverbs' own functions. And an
 * MR the cache never made is deregistered by libibverbs. */
#include "lib/loopback.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>

typedef struct ibv_mr *(*reg_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
typedef int (*dereg_fn)(struct ibv_mr *);

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    reg_fn real_reg = (reg_fn)lb_libibverbs_symbol("ibv_reg_mr_iova2", "IBVERBS_1.8");
    dereg_fn real_dereg = (dereg_fn)lb_libibverbs_symbol("ibv_dereg_mr", "IBVERBS_1.1");
    CHECK(real_reg && real_dereg, "libibverbs' own functions");
    char *buf = malloc(1 << 20);
    struct {
        const char *what;
        void *addr;
        size_t len;
        unsigned access;
    } cases[] = {
        {"zero length", buf, 0, IBV_ACCESS_LOCAL_WRITE},
        {"length wraps the address space", buf, (size_t)-4096, IBV_ACCESS_LOCAL_WRITE},
        {"address near the top", (void *)(uintptr_t)-8192, 1 << 20, IBV_ACCESS_LOCAL_WRITE},
        {"unknown access bit 12", buf, 4096, IBV_ACCESS_LOCAL_WRITE | (1u << 12)},
        {"unknown access bit 31", buf, 4096, IBV_ACCESS_LOCAL_WRITE | (1u << 31)},
        {"on-demand paging (rxe has none)", buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND},
        {"remote write without local write", buf, 4096, IBV_ACCESS_REMOTE_WRITE},
        {"unmapped address", (void *)(uintptr_t)0x10000, 4096, IBV_ACCESS_LOCAL_WRITE},
        {"relaxed ordering (optional bit)", buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned access = cases[i].access; /* a variable: the macro calls ibv_reg_mr_iova2 */
        errno = 0;
        struct ibv_mr *ours = ibv_reg_mr(lb.pd, cases[i].addr, cases[i].len, access);
        int e1 = errno;
        errno = 0;
        struct ibv_mr *theirs = real_reg(lb.pd, cases[i].addr, cases[i].len, (uintptr_t)cases[i].addr, access);
        int e2 = errno;
        printf("%-36s hooked: %s errno %d, libibverbs: %s errno %d\n", cases[i].what,
               ours ? "ok" : "NULL", ours ? 0 : e1, theirs ? "ok" : "NULL", theirs ? 0 : e2);
        CHECK((ours == NULL) == (theirs == NULL), "%s: different outcome", cases[i].what);
        CHECK(ours || e1 == e2, "%s: errno %d vs libibverbs' %d", cases[i].what, e1, e2);
        if (ours)
            CHECK(ibv_dereg_mr(ours) == 0, "%s: dereg", cases[i].what);
        if (theirs)
            CHECK(real_dereg(theirs) == 0, "%s: dereg", cases[i].what);
    }
    /* An MR made by libibverbs directly goes back to libibverbs through the hook. */
    struct ibv_mr *direct = real_reg(lb.pd, buf, 1 << 20, (uintptr_t)buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(direct, "direct registration");
    CHECK(ibv_dereg_mr(direct) == 0, "hooked dereg of an MR the cache never made");
    lb_close(&lb);
    printf("bad_input: ok\n");
    return 0;
}
