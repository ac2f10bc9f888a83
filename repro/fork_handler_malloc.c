/* A single-threaded program (glibc's single-threaded fork rules: fork() in a signal handler
 * takes no allocator lock) whose SIGALRM handler forks while the main loop is in malloc/free
 * of its own. Between its verbs calls an idle cached entry's memory is unmapped, so the
 * cache has pending invalidations at the fork: does mrcache's prepare handler allocate /
 * deregister (free) inside the interrupted malloc?
 * usage: fork_handler_malloc SECONDS ; prints forks and children that died; exit 0. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <errno.h>

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) { free(mr); return 0; }
static struct ibv_context ctx;
static struct ibv_pd pd;
static volatile sig_atomic_t forks, bad;

static void on_alarm(int s) {
    (void)s;
    int e = errno;
    pid_t c = fork();
    if (c == 0) _exit(0);
    if (c > 0) {
        int st;
        forks++;
        if (waitpid(c, &st, 0) == c && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) bad++;
    }
    errno = e;
}

int main(int argc, char **argv) {
    int secs = argc > 1 ? atoi(argv[1]) : 5;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    long us = argc > 2 ? atol(argv[2]) : 2000;
    struct itimerval it = {{0, us}, {0, us}};
    setitimer(ITIMER_REAL, &it, NULL);
    time_t end = time(NULL) + secs;
    void *keep[64] = {0};
    unsigned seed = 1;
    long rounds = 0;
    while (time(NULL) < end) {
        size_t len = 64 << 10;
        char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b[0] = 1;
        for (int k = 0; k < 4; k++) {
            struct ibv_mr *m = ibv_reg_mr(&pd, b + k * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
            if (!m || ibv_dereg_mr(m)) return 3;
        }
        munmap(b, len); /* idle entries' memory gone: invalidations pending until the next call */
        for (int i = 0; i < 2000; i++) {
            int j = rand_r(&seed) % 64;
            free(keep[j]);
            keep[j] = malloc(16 + rand_r(&seed) % 600);
        }
        rounds++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("rounds %ld forks %d children that died %d\n", rounds, (int)forks, (int)bad);
    return 0;
}
