/* Stands in for libibverbs' ibv_reg_mr_iova2 and ibv_dereg_mr behind libmrcache.so, which
 * finds them first (dlvsym RTLD_NEXT) when this library comes after it in LD_PRELOAD: a
 * registration libmrcache passes through reaches the fake provider's ops (libibverbs itself
 * cannot handle a fake context), and is counted. */
#include <infiniband/verbs.h>
#include <stdatomic.h>

/* Atomic: threads and fork children of the tests that include this file count too. */
atomic_int shim_regs, shim_deregs;

struct ibv_mr *shim_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access) {
    struct ibv_mr *(*op)(struct ibv_pd *, void *, size_t, uint64_t, int) = (void *)pd->context->ops._compat_reg_mr;
    struct ibv_mr *mr = op(pd, addr, len, iova, (int)access);
    if (mr) {
        mr->context = pd->context, mr->pd = pd, mr->addr = addr, mr->length = len;
        shim_regs++;
    }
    return mr;
}

int shim_dereg_mr(struct ibv_mr *mr) {
    int (*op)(struct ibv_mr *) = (void *)mr->context->ops._compat_dereg_mr;
    shim_deregs++;
    return op(mr);
}

__asm__(".symver shim_reg_mr_iova2, ibv_reg_mr_iova2@@IBVERBS_1.8");
__asm__(".symver shim_dereg_mr, ibv_dereg_mr@@IBVERBS_1.1");
