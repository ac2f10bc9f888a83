/* Stands in for libibverbs' ibv_reg_mr_iova2, ibv_dereg_mr and ibv_rereg_mr behind
 * libmrcache.so (found first with dlvsym RTLD_NEXT when this library comes after it in
 * LD_PRELOAD), over the fake provider's ops, as verbs_shim.c does for reg/dereg; every call
 * passed through is counted. Its rereg does what libibverbs' does: the provider's op, then
 * the new pd/addr/length in the MR. */
#include <errno.h>
#include <infiniband/verbs.h>

int shim_regs, shim_deregs, shim_reregs;

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

int shim_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access) {
    int (*op)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int) = (void *)mr->context->ops._compat_rereg_mr;
    shim_reregs++;
    if (op(mr, flags, pd, addr, len, access)) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_CMD;
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) mr->addr = addr, mr->length = len;
    return 0;
}

__asm__(".symver shim_reg_mr_iova2, ibv_reg_mr_iova2@@IBVERBS_1.8");
__asm__(".symver shim_dereg_mr, ibv_dereg_mr@@IBVERBS_1.1");
__asm__(".symver shim_rereg_mr, ibv_rereg_mr@@IBVERBS_1.1");
