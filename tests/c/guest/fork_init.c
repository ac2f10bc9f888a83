/* fork while another thread's first registration is still setting the library up: the
 * child's own first verbs call must not wait for a set-up that no thread of the child runs.
 * Run with MRCACHE_TEST_INIT_DELAY_MS (a test-only knob that stalls the set-up) so the fork
 * lands inside it; the main thread forks once the registering thread sleeps in there.
 * A hung child is killed by alarm() and reported. */
#include "lib/loopback.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (1u << 20)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct ibv_pd *pd;
static char *buf;
static volatile pid_t tid;
static volatile int returned;

static void *first_registration(void *arg) {
    (void)arg;
    tid = syscall(SYS_gettid);
    struct ibv_mr *m = ibv_reg_mr(pd, buf, LEN, ACCESS);
    CHECK(m, "the first registration");
    returned = 1;
    CHECK(ibv_dereg_mr(m) == 0, "dereg");
    return NULL;
}

/* Whether thread t is blocked in nanosleep / clock_nanosleep. */
static int sleeping(pid_t t) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)t);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    long nr = -1;
    if (fgets(line, sizeof line, f))
        nr = atol(line);
    fclose(f);
    return nr == SYS_nanosleep || nr == SYS_clock_nanosleep;
}

int main(void) {
    CHECK(getenv("MRCACHE_TEST_INIT_DELAY_MS"), "run with MRCACHE_TEST_INIT_DELAY_MS");
    /* Device and PD without any registration: the library is not set up yet. */
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "no device");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "open");
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "pd");
    buf = malloc(LEN);
    memset(buf, 1, LEN);
    pthread_t t;
    pthread_create(&t, NULL, first_registration, NULL);
    if (mrcache_loaded()) {
        while (!tid || !sleeping(tid))
            usleep(1000);
    }
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        alarm(120); /* a hang becomes a failure the parent reports */
        struct loopback own;
        CHECK(lb_open(&own, NULL) == 0, "child: open the device");
        char *c = malloc(LEN);
        struct ibv_mr *m = ibv_reg_mr(own.pd, c, LEN, ACCESS);
        CHECK(m && lb_prove_write(&own, m, c, LEN, 7) == 0, "child: registration");
        CHECK(ibv_dereg_mr(m) == 0, "child: dereg");
        lb_close(&own);
        _exit(0);
    }
    int was_inside = !returned;
    int st;
    CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child %s",
          WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? "hung in its first verbs call (killed after 120 s)" : "failed");
    pthread_join(t, NULL);
    if (mrcache_loaded())
        CHECK(was_inside, "the fork happened after the set-up finished: nothing tested");
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("fork_init: ok\n");
    return 0;
}
