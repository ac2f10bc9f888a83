/* A local registration admission passes through, in use at
 * fork(), under RDMAV_FORK_SAFE=1. The fake provider of admit_cost.c (included; its main
 * renamed) behind libmrcache.so and libadmit_shim.so (libibverbs' reg/dereg, counting).
 *   admit_fork scan: MRCACHE_MAX_ENTRIES=4; 4 local keys used 20 times each, then a fifth
 *     key the TinyLFU rule refuses, held across a fork. Prints whether libibverbs
 *     registered it ("libibverbs regs +N") and the provider registrations it took; the
 *     statistics at exit say how many ranges the preload marked DONTFORK.
 * exit 0 unless set-up failed (3). */
#include <sys/wait.h>
#include <unistd.h>
#define main admit_cost_main
#include "admit_cost.c"
#undef main

int main(void) {
    atomic_int *sregs = dlsym(RTLD_DEFAULT, "shim_regs");
    if (!sregs) {
        fprintf(stderr, "admit_fork: libadmit_shim.so is not preloaded\n");
        return 3;
    }
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    size_t len = 64 << 10;
    char *buf = mmap(NULL, 16 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, 16 * len);
    reg_ns = 20000;
    for (int r = 0; r < 20; r++)
        for (int k = 0; k < 4; k++) {
            struct ibv_mr *mr = ibv_reg_mr(&pd, buf + k * len, len, IBV_ACCESS_LOCAL_WRITE);
            if (!mr || ibv_dereg_mr(mr)) return 3;
        }
    long pr = provider_regs;
    int sr = *sregs;
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf + 9 * len, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 3;
    pid_t c = fork();
    if (c == 0) _exit(0);
    if (c < 0) return 3;
    waitpid(c, NULL, 0);
    printf("scan-refused held at fork: libibverbs regs +%d, provider regs +%ld\n", *sregs - sr,
           provider_regs - pr);
    if (ibv_dereg_mr(mr)) return 3;
    return 0;
}
