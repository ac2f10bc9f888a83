/* ibv_rereg_mr on a registration that came from the cache gives what libibverbs alone
 * gives for the same call (rxe has no rereg op: IBV_REREG_MR_ERR_CMD, MR unchanged), the MR
 * keeps working, and the cache does not hand it out again afterwards. */
#include "lib/loopback.h"

#include <dlfcn.h>

typedef struct ibv_mr *(*reg_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
typedef int (*dereg_fn)(struct ibv_mr *);
typedef int (*rereg_fn)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    reg_fn real_reg = (reg_fn)lb_libibverbs_symbol("ibv_reg_mr_iova2", "IBVERBS_1.8");
    dereg_fn real_dereg = (dereg_fn)lb_libibverbs_symbol("ibv_dereg_mr", "IBVERBS_1.1");
    rereg_fn real_rereg = (rereg_fn)lb_libibverbs_symbol("ibv_rereg_mr", "IBVERBS_1.1");
    CHECK(real_reg && real_dereg && real_rereg, "libibverbs' own functions");
    size_t len = 1 << 20;
    char *buf = malloc(len), *other = malloc(len);
    int flags = IBV_REREG_MR_CHANGE_ACCESS;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

    /* What libibverbs alone answers, on a registration of its own. */
    struct ibv_mr *ref = real_reg(lb.pd, other, len, (uintptr_t)other, IBV_ACCESS_LOCAL_WRITE);
    CHECK(ref, "reference registration");
    int want = real_rereg(ref, flags, NULL, NULL, 0, access);
    CHECK(real_dereg(ref) == 0, "reference dereg");

    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr && ibv_dereg_mr(mr) == 0, "warm the cache");
    mr = ibv_reg_mr(lb.pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "registration");
    int rc = ibv_rereg_mr(mr, flags, NULL, NULL, 0, access);
    CHECK(rc == want, "ibv_rereg_mr returned %d, libibverbs alone returns %d", rc, want);
    if (rc == 0)
        CHECK(lb_prove_write(&lb, mr, buf, len, 11) == 0, "remote write after rereg");
    /* Bad flags are refused the same way. */
    CHECK(ibv_rereg_mr(mr, 1 << 7, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT, "bad flags");
    struct ibv_mr *again = ibv_reg_mr(lb.pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    CHECK(again && again != mr, "the rereg'd MR was handed out again");
    CHECK(ibv_dereg_mr(again) == 0 && ibv_dereg_mr(mr) == 0, "dereg");
    lb_close(&lb);
    printf("rereg: ok (provider answers %d)\n", want);
    return 0;
}
