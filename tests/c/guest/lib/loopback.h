/* Test helper: two RC QPs on one rxe device connected to each other (loopback over
 * RoCE v2, GID index 1), so a test can prove with a real RDMA WRITE that data lands in the
 * memory a registration claims to cover. */
#ifndef MRCACHE_TEST_LOOPBACK_H
#define MRCACHE_TEST_LOOPBACK_H
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>

struct loopback {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp[2]; /* qp[0] posts, qp[1] is the target side */
    unsigned char *stage; /* source of lb_prove_write, registered once at open */
    struct ibv_mr *stage_mr;
    int shared; /* ctx and pd belong to another struct loopback */
};
#define LB_STAGE_BYTES (4u << 20)

/* Open the device (NULL: $MRCACHE_TEST_DEVICE or "rxe0"), allocate PD/CQ, connect the QPs.
 * Returns 0 or an errno-style code; prints what failed. */
int lb_open(struct loopback *lb, const char *device);
/* A second QP pair (with its own CQ and staging buffer) on parent's context and PD, for
 * another thread. Close it with lb_close before the parent. */
int lb_open_shared(struct loopback *lb, const struct loopback *parent);
/* Frees everything; exits with a failure if the PD or device cannot be freed. */
void lb_close(struct loopback *lb);

/* Whether libmrcache.so is loaded in this process. */
int mrcache_loaded(void);
/* libibverbs' own function, for tests that compare with it: libmrcache.so's dlsym/dlvsym
 * answer lookups of the verbs functions it wraps with its hooks, so this calls libc's
 * dlvsym directly. */
void *lb_libibverbs_symbol(const char *name, const char *version);

/* RDMA WRITE of len bytes from src (covered by src_mr, lkey) to raddr/rkey; waits for the
 * completion. Returns 0, or the failed work completion status (+1000), or an errno. */
int lb_write(struct loopback *lb, const void *src, size_t len, uint32_t lkey,
             uint64_t raddr, uint32_t rkey);
/* RDMA READ of len bytes from raddr/rkey into dst (lkey). Same return convention. */
int lb_read(struct loopback *lb, void *dst, size_t len, uint32_t lkey, uint64_t raddr,
            uint32_t rkey);

/* rxe hands out a failed completion before it moves the QPs to the error state (its
 * completer posts the completion, then moves the posting QP; after a NAK the responder moves
 * the target QP once the NAK is sent), so a QP reset as soon as the completion is polled can
 * be moved to ERR afterwards. This waits until qp[0], which posted the failed work request,
 * and, for a status a NAK gives, qp[1], its target, report IBV_QPS_ERR; one still not there
 * after 5 s is reported on stderr. Returns 0, or -1 if it gave up. */
int lb_await_error_state(struct ibv_qp *const qp[2], enum ibv_wc_status status);
/* Reset both QPs, empty the CQ and connect them again (RESET to RTS). Returns 0 or the failed
 * step's errno, and prints it. After a failed completion call lb_await_error_state first. */
int lb_reconnect(struct loopback *lb);
/* Destroy both QPs, empty the CQ and connect a new pair: nothing a failure left pending on
 * the old pair reaches the new one. Returns 0 or an errno-style code, and prints it. */
int lb_renew(struct loopback *lb);

/* Fill buf with a pattern derived from seed, and check it. */
void lb_fill(void *buf, size_t len, unsigned seed);
/* Returns the offset of the first mismatch, or -1 when buf holds the pattern. */
long lb_check(const void *buf, size_t len, unsigned seed);

/* Prove that mr (which must cover [dst, dst+len) with REMOTE_WRITE) reaches the pages now
 * backing dst: write a fresh pattern into dst through the NIC and compare. Returns 0 on
 * success, -1 (and prints why) on failure. LB_PROVE=page-heads in the environment writes
 * only the head of each page (see loopback.c). */
int lb_prove_write(struct loopback *lb, struct ibv_mr *mr, void *dst, size_t len, unsigned seed);

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif
