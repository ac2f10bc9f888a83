/* fork() in a signal handler of a program without threads of its own, while the program is
 * in its own malloc or free: glibc's fork() takes no allocator lock there (single-threaded
 * rules), so mrcache's prepare handler must not allocate or free either. Behind
 * libmrcache.so and verbs_shim.c (a fake provider whose registrations are calloc'd and
 * freed). Each round caches four idle entries and unmaps their memory, so invalidations
 * are pending (work for a drain) at most forks; then 2000 malloc/free of the program's own
 * while SIGALRM every 2 ms forks (the child exits at once, the handler waits for it).
 *   fork_in_malloc storm   runs 5 s: "storm: F forks, 0 children died"
 * The heap corrupted shows as glibc's abort ("double free detected in tcache 2",
 * "unaligned tcache chunk detected") or SIGSEGV. exit 0, 3 when set-up failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}
static struct ibv_context ctx;
static struct ibv_pd pd;
static volatile sig_atomic_t forks, died;

static void on_alarm(int s) {
    (void)s;
    int e = errno;
    pid_t c = fork();
    if (c == 0) _exit(0);
    if (c > 0) {
        int st;
        forks++;
        if (waitpid(c, &st, 0) == c && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) died++;
    }
    errno = e;
}

int main(void) {
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGALRM, &sa, NULL)) return 3;
    struct itimerval it = {{0, 2000}, {0, 2000}};
    if (setitimer(ITIMER_REAL, &it, NULL)) return 3;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    void *keep[64] = {0};
    unsigned seed = 1;
    do {
        size_t len = 64 << 10;
        char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b == MAP_FAILED) return 3;
        b[0] = 1;
        for (int k = 0; k < 4; k++) {
            struct ibv_mr *m = ibv_reg_mr(&pd, b + k * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
            if (!m || ibv_dereg_mr(m)) return 3;
        }
        munmap(b, len);
        for (int i = 0; i < 2000; i++) {
            int j = rand_r(&seed) % 64;
            free(keep[j]);
            keep[j] = malloc(16 + rand_r(&seed) % 600);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - t0.tv_sec < 5);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("storm: %d forks, %d children died\n", (int)forks, (int)died);
    return 0;
}
