/* Stands in for libibverbs' ibv_reg_mr_iova2, ibv_dereg_mr and ibv_rereg_mr behind
 * libmrcache.so (found first with dlvsym RTLD_NEXT when this library comes after it in
 * LD_PRELOAD), over the fake provider's ops, as verbs_shim.c does for reg/dereg; every call
 * passed through is counted. Its rereg does what libibverbs' does: the provider's op, then
 * the new pd/addr/length in the MR. */
#include <errno.h>
#include "verbs_shim.c" /* ibv_reg_mr_iova2, ibv_dereg_mr */

int shim_reregs;

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

__asm__(".symver shim_rereg_mr, ibv_rereg_mr@@IBVERBS_1.1");
