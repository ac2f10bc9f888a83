/* The drain thread starts at the first registration, even one passed through (a
 * start at the first cached call put its malloc arena in a hole the program
 * had just freed), and does its work: behind libmrcache.so and verbs_shim.c,
 * MRCACHE_REMOTE=bypass (remote registrations pass through, local ones are cached).
 *   drain_start late    100 remote pairs passed through, then one local entry cached and
 *                       idle, its memory unmapped with no verbs call after: "late: drains
 *                       D0 D1, deregistered by the drain X"
 *   drain_start overflow as late, with 5000 unmaps (the invalidation ring holds 1024, no
 *                       drain to empty it) before the cached call
 *   drain_start child   the same in a fork child (on a context of its own) of a parent that
 *                       cached (and drains):
 *                       "child: drains D0 D1, deregistered by the drain X"
 *   drain_start arena_E a 200 MiB block malloc'd, freed and malloc'd again around the
 *                       first cached call (E=early: one cached call at the start too),
 *                       after a remote pair passed through: "arena E: same address S"
 * The program starts (and joins) a thread of its own first: mrcache's drain thread runs
 * only in a program that has threads (one without keeps glibc's single-threaded rules, and
 * its drain runs at its verbs calls: tests/c/host/underscore_fork_single_thread.c).
 * exit 0 unless set-up failed (3). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int deregs;
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    deregs++;
    free(mr);
    return 0;
}

static int threads_named(const char *name) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], comm[32] = "";
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
        fclose(f);
        n += !strcmp(comm, name);
    }
    closedir(d);
    return n;
}

static struct ibv_context ctx;
static struct ibv_pd pd;

static int scenario(const char *name) {
    size_t len = 1 << 20;
    char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *l = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(r, 1, len), memset(l, 1, len);
    for (int i = 0; i < 100; i++) {
        struct ibv_mr *m = ibv_reg_mr(&pd, r, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
    }
    if (!strcmp(name, "overflow"))
        for (int i = 0; i < 5000; i++) {
            char *u = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            munmap(u, 4096);
        }
    int d0 = threads_named("mrcache-drain");
    struct ibv_mr *m = ibv_reg_mr(&pd, l, len, IBV_ACCESS_LOCAL_WRITE);
    if (!m || ibv_dereg_mr(m)) return 3;
    int d1 = threads_named("mrcache-drain");
    int before = deregs;
    munmap(l, len);
    struct timespec t = {0, 300 * 1000000L};
    nanosleep(&t, NULL);
    printf("%s: drains %d %d, deregistered by the drain %d\n", name, d0, d1, deregs - before);
    fflush(stdout);
    return 0;
}

static void *nothing(void *arg) { return arg; }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "late";
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) || pthread_join(t, NULL)) return 3;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    if (!strcmp(mode, "late") || !strcmp(mode, "overflow")) return scenario(mode);
    if (!strncmp(mode, "arena_", 6)) {
        int early = !strcmp(mode, "arena_early");
        /* Whether this system reuses a freed big block's address at all (before any verbs
         * call): qemu-user's mmap places a new mapping past the last one, not in the hole. */
        size_t probe = 200u << 20;
        char *x = malloc(probe);
        free(x);
        char *y = malloc(probe);
        free(y);
        if (x != y) {
            printf("arena %s: no reuse here: a freed %zu MiB block's address is not reused without the preload's threads either\n",
                   early ? "early" : "late", probe >> 20);
            return 0;
        }
        static char small[1 << 16];
        memset(small, 1, sizeof small);
        if (early) {
            struct ibv_mr *m = ibv_reg_mr(&pd, small, 4096, IBV_ACCESS_LOCAL_WRITE);
            if (!m || ibv_dereg_mr(m)) return 3;
        }
        struct ibv_mr *m = ibv_reg_mr(&pd, small, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
        size_t big = 200u << 20;
        char *a = malloc(big);
        a[0] = 1;
        free(a);
        m = ibv_reg_mr(&pd, small + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
        char *b = malloc(big);
        printf("arena %s: same address %d (drains %d)\n", early ? "early" : "late", a == b,
               threads_named("mrcache-drain"));
        return 0;
    }
    if (!strcmp(mode, "child")) {
        char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(p, 1, 1 << 20);
        struct ibv_mr *m = ibv_reg_mr(&pd, p, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
        printf("parent: drains %d\n", threads_named("mrcache-drain"));
        fflush(stdout);
        pid_t c = fork();
        if (c == 0) {
            /* The child's own context (a parent's one passes every call through). */
            ctx.cmd_fd = open("/dev/null", O_RDONLY);
            _exit(scenario("child"));
        }
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st)) return 3;
        return WEXITSTATUS(st);
    }
    return 2;
}
