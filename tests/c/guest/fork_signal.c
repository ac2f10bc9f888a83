/* _Fork() is async-signal-safe: call it from a signal handler that interrupts a thread in
 * the middle of registrations (so sometimes inside the cache's lock). The child exits at
 * once; the parent carries on registering and proves its data lands. A deadlock becomes a
 * failure through alarm().
 *
 *   fork_signal N   (N signals)
 */
#include "lib/loopback.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (256u << 10)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct loopback lb;
static volatile sig_atomic_t handled, failed_fork;
static volatile int stop;

static void on_usr1(int sig) {
    (void)sig;
    pid_t pid = _Fork();
    if (pid == 0)
        _exit(0);
    if (pid < 0)
        failed_fork = 1;
    else
        waitpid(pid, NULL, 0);
    handled++;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL fork_signal: hung (a _Fork from a signal handler deadlocked)\n";
    write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void *registrar(void *arg) {
    char *bufs = arg;
    for (unsigned i = 0; !stop; i++) {
        char *p = bufs + (i % 4) * LEN;
        struct ibv_mr *m = ibv_reg_mr(lb.pd, p, LEN, ACCESS);
        CHECK(m, "reg %u", i);
        if (i % 50 == 0)
            CHECK(lb_prove_write(&lb, m, p, LEN, i) == 0, "data %u", i);
        CHECK(ibv_dereg_mr(m) == 0, "dereg %u", i);
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: fork_signal N");
    int n = atoi(argv[1]);
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    signal(SIGALRM, on_alarm);
    struct sigaction sa = {.sa_handler = on_usr1};
    sigaction(SIGUSR1, &sa, NULL);
    char *bufs = malloc(4 * LEN);
    memset(bufs, 1, 4 * LEN);
    pthread_t t;
    pthread_create(&t, NULL, registrar, bufs);
    alarm(250); /* the guest's limit per case is 300 s */
    for (int i = 0; i < n; i++) {
        sig_atomic_t before = handled;
        pthread_kill(t, SIGUSR1);
        while (handled == before)
            usleep(100);
    }
    stop = 1;
    pthread_join(t, NULL);
    alarm(0);
    CHECK(!failed_fork, "_Fork failed");
    /* After the forks: registrations still land where they claim. */
    for (int i = 0; i < 4; i++) {
        struct ibv_mr *m = ibv_reg_mr(lb.pd, bufs + i * LEN, LEN, ACCESS);
        CHECK(m && lb_prove_write(&lb, m, bufs + i * LEN, LEN, 100 + i) == 0, "data after the forks");
        CHECK(ibv_dereg_mr(m) == 0, "dereg");
    }
    lb_close(&lb);
    printf("fork_signal: ok (%d forks from a signal handler)\n", n);
    return 0;
}
