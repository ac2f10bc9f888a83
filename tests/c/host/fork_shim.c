/* Stands in for libibverbs behind libmrcache.so (LD_PRELOAD after it: our dlvsym(RTLD_NEXT)
 * finds these first): ibv_reg_mr_iova2 and ibv_dereg_mr, for registrations mrcache passes
 * through, reach the fake provider's ops (libibverbs cannot handle a fake context); and
 * ibv_dontfork_range / ibv_dofork_range record the ranges they are given, so a test sees
 * what mrcache marks DONTFORK around a fork. Lock-free: threads and fork children use it. */
#include <stdint.h>
#include "verbs_shim.c" /* ibv_reg_mr_iova2, ibv_dereg_mr */

atomic_int shim_dontforks, shim_doforks;
/* The last range each was given. */
_Atomic uintptr_t shim_dontfork_base, shim_dofork_base;
_Atomic size_t shim_dontfork_len, shim_dofork_len;

int shim_dontfork_range(void *base, size_t size) {
    shim_dontfork_base = (uintptr_t)base;
    shim_dontfork_len = size;
    shim_dontforks++;
    return 0;
}

int shim_dofork_range(void *base, size_t size) {
    shim_dofork_base = (uintptr_t)base;
    shim_dofork_len = size;
    shim_doforks++;
    return 0;
}

__asm__(".symver shim_dontfork_range, ibv_dontfork_range@@IBVERBS_1.1");
__asm__(".symver shim_dofork_range, ibv_dofork_range@@IBVERBS_1.1");
