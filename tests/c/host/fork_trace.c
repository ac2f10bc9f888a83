/* fork() while mrcache's trace writer is writing (MRCACHE_LOG=trace): a thread hammers
 * hits, so the trace ring always holds records and the writer is mostly inside its drain;
 * the main thread forks; each child registers and leaves through exit(), which flushes the
 * trace. The child must not inherit a lock of the writer's (gone in the child) held: its
 * first drain or its exit would wait for it forever.
 *   fork_trace ROUNDS */
#include "fork_fake.h"

static atomic_int stop, cycles;
static char *hot;

static void child(void) { alarm(5); }

static void *hitting(void *arg) {
    (void)arg;
    while (!stop) {
        dereg(reg(hot, LEN));
        cycles++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int rounds = atoi(argv[1]);
    SETUP(!pthread_atfork(NULL, NULL, child), "pthread_atfork");
    fake_open();
    hot = map(LEN);
    SETUP(cycle_missed(hot, LEN) && !cycle_missed(hot, LEN), "the cache did not keep a registration");
    pthread_t t;
    SETUP(!pthread_create(&t, NULL, hitting, NULL), "pthread_create");
    while (cycles < 1000) usleep(100);
    for (int i = 0; i < rounds; i++) {
        alarm(5);
        pid_t pid = fork();
        if (pid == 0) {
            char *c = map(LEN);
            cycle_missed(c, LEN);
            exit(0);
        }
        SETUP(pid > 0, "fork");
        alarm(0);
        wait_child(pid, "fork");
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("fork_trace: %d forks finished while another thread made %d traced calls\n", rounds, (int)cycles);
    return 0;
}
