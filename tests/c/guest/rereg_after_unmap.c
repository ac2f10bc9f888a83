/* ibv_rereg_mr of the app's only handle after its buffer was unmapped, and,
 * with the preload, of an MR the app already released, on rxe.
 *   unmapped: IBV_REREG_MR_CHANGE_TRANSLATION to a new buffer once the unmap was drained gives
 *       what libibverbs alone gives for its own registration (rxe has no rereg op), never
 *       the cache's "shared with other users" (IBV_REREG_MR_ERR_INPUT); the app's
 *       ibv_dereg_mr of it then works.
 *   released: rereg of an MR the cache holds idle is IBV_REREG_MR_ERR_INPUT with errno EINVAL and
 *       the next registration of the buffer is a hit on the unchanged MR. */
#include "lib/loopback.h"

#include <errno.h>
#include <sys/mman.h>

typedef struct ibv_mr *(*reg_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
typedef int (*dereg_fn)(struct ibv_mr *);
typedef int (*rereg_fn)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);

#define LEN (1ul << 20)

static char *map(void) {
    char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    memset(p, 1, LEN);
    return p;
}

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    reg_fn real_reg = (reg_fn)lb_libibverbs_symbol("ibv_reg_mr_iova2", "IBVERBS_1.8");
    dereg_fn real_dereg = (dereg_fn)lb_libibverbs_symbol("ibv_dereg_mr", "IBVERBS_1.1");
    rereg_fn real_rereg = (rereg_fn)lb_libibverbs_symbol("ibv_rereg_mr", "IBVERBS_1.1");
    CHECK(real_reg && real_dereg && real_rereg, "libibverbs' own functions");
    int flags = IBV_REREG_MR_CHANGE_TRANSLATION, access = IBV_ACCESS_LOCAL_WRITE;

    /* What libibverbs alone answers, on a registration of its own. */
    char *old = map(), *fresh = map(), *other = map();
    struct ibv_mr *ref = real_reg(lb.pd, old, LEN, (uintptr_t)old, access);
    CHECK(ref, "reference registration");
    CHECK(munmap(old, LEN) == 0, "munmap");
    int want = real_rereg(ref, flags, NULL, fresh, LEN, 0);
    CHECK(real_dereg(ref) == 0, "reference dereg");

    old = map();
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, old, LEN, access);
    CHECK(mr, "registration");
    CHECK(munmap(old, LEN) == 0, "munmap");
    struct ibv_mr *o = ibv_reg_mr(lb.pd, other, LEN, access); /* a miss drains the unmap */
    CHECK(o && ibv_dereg_mr(o) == 0, "reg/dereg of another buffer");
    int rc = ibv_rereg_mr(mr, flags, NULL, fresh, LEN, 0);
    CHECK(rc == want, "ibv_rereg_mr of the only handle after munmap returned %d, libibverbs alone returns %d", rc, want);
    CHECK(ibv_dereg_mr(mr) == 0, "dereg after rereg");

    if (mrcache_loaded()) {
        char *buf = map();
        struct ibv_mr *cached = ibv_reg_mr(lb.pd, buf, LEN, access);
        CHECK(cached && ibv_dereg_mr(cached) == 0, "cached, idle");
        errno = 0;
        rc = ibv_rereg_mr(cached, flags, NULL, fresh, LEN, 0);
        int err = errno;
        CHECK(rc == IBV_REREG_MR_ERR_INPUT && err == EINVAL,
              "ibv_rereg_mr of an MR the app released returned %d (errno %d)", rc, err);
        struct ibv_mr *hit = ibv_reg_mr(lb.pd, buf, LEN, access);
        CHECK(hit == cached && hit->addr == buf && hit->length == LEN, "the cached MR changed");
        CHECK(ibv_dereg_mr(hit) == 0, "dereg");
    }
    lb_close(&lb);
    printf("rereg_after_unmap: ok (provider answers %d)\n", want);
    return 0;
}
