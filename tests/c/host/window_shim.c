/* Stands in for the libibverbs calls MRCACHE_REMOTE=revoke makes to set up its QP on a PD
 * (ibv_query_device/port/gid, ibv_create_cq/qp, ibv_modify_qp, ibv_destroy_*), behind
 * libmrcache.so in LD_PRELOAD (it finds them with dlvsym RTLD_NEXT): libibverbs itself
 * cannot handle the fake context of revoke_after_unbind_timeout.c. Binds and polls go through the context's
 * ops (the program's fake provider), as ibv_bind_mw and ibv_poll_cq do inline. */
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

int shim_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
    (void)ctx;
    memset(a, 0, sizeof(*a));
    a->max_mw = 64;
    return 0;
}

int shim_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a) {
    (void)ctx, (void)port;
    memset(a, 0, sizeof(*a));
    a->state = IBV_PORT_ACTIVE;
    a->active_mtu = IBV_MTU_1024;
    a->lid = 1;
    a->link_layer = IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

int shim_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
    (void)ctx, (void)port, (void)index;
    memset(gid, 0, sizeof(*gid));
    return 0;
}

struct ibv_cq *shim_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch, int vec) {
    (void)cqe, (void)cq_context, (void)ch, (void)vec;
    struct ibv_cq *cq = calloc(1, sizeof(*cq));
    cq->context = ctx;
    return cq;
}

struct ibv_qp *shim_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init) {
    static uint32_t qpn = 100;
    struct ibv_qp *qp = calloc(1, sizeof(*qp));
    qp->context = pd->context, qp->pd = pd, qp->send_cq = init->send_cq, qp->recv_cq = init->recv_cq;
    qp->qp_num = qpn++;
    qp->qp_type = init->qp_type;
    return qp;
}

int shim_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
    (void)mask;
    qp->state = a->qp_state;
    return 0;
}

int shim_destroy_qp(struct ibv_qp *qp) {
    free(qp);
    return 0;
}

int shim_destroy_cq(struct ibv_cq *cq) {
    free(cq);
    return 0;
}

__asm__(".symver shim_query_device, ibv_query_device@@IBVERBS_1.1");
__asm__(".symver shim_query_port, ibv_query_port@@IBVERBS_1.1");
__asm__(".symver shim_query_gid, ibv_query_gid@@IBVERBS_1.1");
__asm__(".symver shim_create_cq, ibv_create_cq@@IBVERBS_1.1");
__asm__(".symver shim_create_qp, ibv_create_qp@@IBVERBS_1.1");
__asm__(".symver shim_modify_qp, ibv_modify_qp@@IBVERBS_1.1");
__asm__(".symver shim_destroy_qp, ibv_destroy_qp@@IBVERBS_1.1");
__asm__(".symver shim_destroy_cq, ibv_destroy_cq@@IBVERBS_1.1");
