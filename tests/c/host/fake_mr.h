/* Provider ops that register nothing: a calloc'd MR (room after it for a test's own
 * bookkeeping) and its free. Shared by pass_clock.c, fake_device.c and engine_attach.c. Include after the
 * system headers. */
#ifndef MRCACHE_FAKE_MR_H
#define MRCACHE_FAKE_MR_H

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}

static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

#endif
