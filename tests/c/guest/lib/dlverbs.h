/* Test programs built as NCCL-style programs (the files in tests/c/guest/dl/, compiled with
 * -include lib/dlverbs.h and NOT linked with libibverbs): every verbs function they call
 * is a pointer that lib/dlverbs.c looks up with dlsym/dlvsym through a handle from
 * dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL). The same sources as the linked
 * programs, so the dl variants run the same scenarios. */
#ifndef MRCACHE_TEST_DLVERBS_H
#define MRCACHE_TEST_DLVERBS_H
#include <infiniband/verbs.h>

#define DLVERBS_FUNCTIONS(X)                                                                  \
    X(ibv_get_device_list)                                                                    \
    X(ibv_free_device_list)                                                                   \
    X(ibv_get_device_name)                                                                    \
    X(ibv_open_device)                                                                        \
    X(ibv_close_device)                                                                       \
    X(ibv_query_port)                                                                         \
    X(ibv_query_gid)                                                                          \
    X(ibv_alloc_pd)                                                                           \
    X(ibv_dealloc_pd)                                                                         \
    X(ibv_create_cq)                                                                          \
    X(ibv_destroy_cq)                                                                         \
    X(ibv_create_qp)                                                                          \
    X(ibv_destroy_qp)                                                                         \
    X(ibv_modify_qp)                                                                          \
    X(ibv_query_qp)                                                                           \
    X(ibv_reg_mr)                                                                             \
    X(ibv_reg_mr_iova2)                                                                       \
    X(ibv_dereg_mr)

/* verbs.h wraps these two in macros over inline helpers; call the exported symbol. */
#undef ibv_reg_mr
#undef ibv_query_port

#define DLVERBS_DECLARE(name)                                                                 \
    typedef __typeof__(&name) dlv_##name##_t;                                                 \
    extern dlv_##name##_t dlv_##name;
DLVERBS_FUNCTIONS(DLVERBS_DECLARE)
#undef DLVERBS_DECLARE

#define ibv_get_device_list dlv_ibv_get_device_list
#define ibv_free_device_list dlv_ibv_free_device_list
#define ibv_get_device_name dlv_ibv_get_device_name
#define ibv_open_device dlv_ibv_open_device
#define ibv_close_device dlv_ibv_close_device
#define ibv_query_port(ctx, port, attr) dlv_ibv_query_port(ctx, port, (void *)(attr))
#define ibv_query_gid dlv_ibv_query_gid
#define ibv_alloc_pd dlv_ibv_alloc_pd
#define ibv_dealloc_pd dlv_ibv_dealloc_pd
#define ibv_create_cq dlv_ibv_create_cq
#define ibv_destroy_cq dlv_ibv_destroy_cq
#define ibv_create_qp dlv_ibv_create_qp
#define ibv_destroy_qp dlv_ibv_destroy_qp
#define ibv_modify_qp dlv_ibv_modify_qp
#define ibv_query_qp dlv_ibv_query_qp
#define ibv_reg_mr dlv_ibv_reg_mr
#define ibv_reg_mr_iova2 dlv_ibv_reg_mr_iova2
#define ibv_dereg_mr dlv_ibv_dereg_mr

#endif
