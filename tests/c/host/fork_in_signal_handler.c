/* fork() from a signal handler while the interrupted thread is inside mrcache's calls: a
 * SIGALRM 300 us after the last one's handler returned (setitimer, re-armed there, so the
 * main thread always gets its 300 us however long a fork takes) forks; the child _exit(0)s,
 * the parent waitpid()s. The
 * main thread meanwhile maps a page, registers it (a miss), registers it again (a hit),
 * deregisters both and unmaps it, ROUNDS times. Without the preload every fork finishes; no
 * fork may wait for a lock the interrupted frame holds. SIGALRM is the storm, so the bound is
 * a CLOCK_MONOTONIC timer whose SIGVTALRM (default action: terminate) ends a hung run.
 *   fork_in_signal_handler ROUNDS */
#include "fork_fake.h"

#include <sys/time.h>
#include <time.h>

static volatile sig_atomic_t forks, failed, round_now;

/* The bound: say how far it got, then die of the signal. */
static void on_bound(int sig) {
    char msg[160];
    int n = snprintf(msg, sizeof msg, "fork_in_signal_handler: hung after %d rounds and %d forks\n",
                     (int)round_now, (int)forks);
    write(2, msg, n);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid < 0) {
        failed = 1;
    } else {
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 2;
        forks++;
    }
    struct itimerval next = {.it_value = {0, 300}};
    setitimer(ITIMER_REAL, &next, NULL);
    errno = saved;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int rounds = atoi(argv[1]);
    fake_open();
    timer_t bound;
    struct sigevent ev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGVTALRM};
    signal(SIGVTALRM, on_bound);
    SETUP(!timer_create(CLOCK_MONOTONIC, &ev, &bound), "timer_create");
    struct itimerspec limit = {.it_value = {.tv_sec = 25}};
    SETUP(!timer_settime(bound, 0, &limit, NULL), "timer_settime");
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    SETUP(!sigaction(SIGALRM, &sa, NULL), "sigaction");
    /* One cached pair first, so the runtime (and whatever it starts) is up. */
    char *b = map(LEN);
    dereg(reg(b, LEN));
    munmap(b, LEN);
    struct itimerval storm = {.it_value = {0, 300}};
    SETUP(!setitimer(ITIMER_REAL, &storm, NULL), "setitimer");
    int hits = 0;
    for (int i = 0; i < rounds; i++) {
        round_now = i;
        char *p = map(LEN);
        int before = registrations;
        struct ibv_mr *a = reg(p, LEN);
        struct ibv_mr *c = reg(p, LEN);
        hits += registrations == before + 1;
        dereg(c);
        dereg(a);
        munmap(p, LEN);
    }
    signal(SIGALRM, SIG_IGN);
    if (failed) FAIL("a fork in the signal handler failed (%d)", (int)failed);
    printf("fork_in_signal_handler: %d rounds (%d second registrations hits), %d forks from the handler\n",
           rounds, hits, (int)forks);
    return 0;
}
