/* A fake verbs device for the bench programs on the host (tests/host/bench_first_pair_outside_loop.rs):
 * ibv_get_device_list, ibv_open_device, ibv_alloc_pd and their releases, preloaded after
 * libmrcache.so and verbs_shim.so, give bench/regmr.c a context whose provider ops register
 * nothing (a calloc'd MR), so the bench runs unmodified without an RDMA device. */
#include <infiniband/verbs.h>
#include <stdlib.h>

#include "fake_mr.h"

static struct ibv_device device;
static struct ibv_device *devices[2] = {&device, NULL};
static struct ibv_context context;
static struct ibv_pd pd;

struct ibv_device **fake_get_device_list(int *n) {
    if (n) *n = 1;
    return devices;
}

void fake_free_device_list(struct ibv_device **list) { (void)list; }

struct ibv_context *fake_open_device(struct ibv_device *dev) {
    context.device = dev;
    context.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    context.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    return &context;
}

int fake_close_device(struct ibv_context *ctx) { return ctx == &context ? 0 : -1; }

struct ibv_pd *fake_alloc_pd(struct ibv_context *ctx) {
    pd.context = ctx;
    return &pd;
}

int fake_dealloc_pd(struct ibv_pd *p) { return p == &pd ? 0 : -1; }

__asm__(".symver fake_get_device_list, ibv_get_device_list@@IBVERBS_1.1");
__asm__(".symver fake_free_device_list, ibv_free_device_list@@IBVERBS_1.1");
__asm__(".symver fake_open_device, ibv_open_device@@IBVERBS_1.1");
__asm__(".symver fake_close_device, ibv_close_device@@IBVERBS_1.1");
__asm__(".symver fake_alloc_pd, ibv_alloc_pd@@IBVERBS_1.1");
__asm__(".symver fake_dealloc_pd, ibv_dealloc_pd@@IBVERBS_1.1");
