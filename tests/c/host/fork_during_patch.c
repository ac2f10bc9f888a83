/* A fork while another thread's first registration patches libc; the child then registers.
 * The parent forks in a loop for as long as the first registration runs (the patch's
 * membarrier registration takes milliseconds). A child forked before the first jump was
 * written must patch libc itself at its own first registration: its libc is as libc was,
 * and its self-test otherwise turns caching off ("the monitor does not see: munmap inside
 * libc"; the test looks for that line). A fake provider counts registrations: two of the
 * same buffer in a child that reach it once mean a hit. A child whose call passes through
 * (caching off, or a call in flight in the parent at the fork) reaches libibverbs with the
 * fake context and dies: counted, not an error here.
 *   fork_during_patch
 *       prints how many children were forked and how many cached; exit 0 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int registrations;
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    registrations++;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    if (mr) mr->addr = addr, mr->length = len, mr->pd = pd, mr->context = pd->context;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

static struct ibv_context ctx;
static struct ibv_pd pd;
static char *buf;
static const size_t len = 64 << 10;
static atomic_int done;

static void *first_registration(void *arg) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (mr) ibv_dereg_mr(mr);
    done = 1;
    return NULL;
}

int main(void) {
    alarm(60);
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 3;
    pthread_t t;
    if (pthread_create(&t, NULL, first_registration, NULL)) return 3;
    int forks = 0, cached = 0;
    while (!done && forks < 1000) {
        pid_t c = fork();
        if (c < 0) return 3;
        if (c == 0) {
            int before = registrations;
            for (int k = 0; k < 2; k++) {
                struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
                if (!mr || ibv_dereg_mr(mr)) _exit(2);
            }
            /* Caching off passes the call to libibverbs, which cannot run the fake
             * context: the child dies (counted as not cached). */
            _exit(registrations - before == 1 ? 0 : 1);
        }
        forks++;
        int st;
        if (waitpid(c, &st, 0) != c) return 3;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) cached++;
    }
    pthread_join(t, NULL);
    printf("forks %d, children that cached %d\n", forks, cached);
    return 0;
}
