/* fork() in a program whose library holds its own lock L across ibv_reg_mr on one thread
 * and takes L in its prepare handler (registered before the program's first verbs call, so
 * it runs after mrcache's): if mrcache's prepare held the cache lock until the parent or
 * child handler, the fork would wait for L, L's holder for the cache lock.
 *   fork_lock ROUNDS   ROUNDS forks while a second thread, holding L, maps a page,
 *                      registers, deregisters and unmaps it (each registration a miss,
 *                      which takes the cache lock). Every fork must finish. */
#include "fork_fake.h"

static pthread_mutex_t L = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stop, cycles;

static void prepare(void) { pthread_mutex_lock(&L); }
static void parent(void) { pthread_mutex_unlock(&L); }
static void child(void) {
    alarm(5);
    pthread_mutex_unlock(&L);
}

static void *registering(void *arg) {
    (void)arg;
    while (!stop) {
        pthread_mutex_lock(&L);
        char *p = map(LEN);
        dereg(reg(p, LEN));
        munmap(p, LEN);
        pthread_mutex_unlock(&L);
        cycles++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int rounds = atoi(argv[1]);
    SETUP(!pthread_atfork(prepare, parent, child), "pthread_atfork");
    fake_open();
    char *b = map(LEN);
    SETUP(cycle_missed(b, LEN) && !cycle_missed(b, LEN), "the cache did not keep a registration");
    pthread_t t;
    SETUP(!pthread_create(&t, NULL, registering, NULL), "pthread_create");
    while (cycles < 10) usleep(100);
    for (int i = 0; i < rounds; i++) {
        alarm(5);
        pid_t pid = fork();
        if (pid == 0) {
            char *c = map(LEN);
            if (!cycle_missed(c, LEN) || cycle_missed(c, LEN))
                FAIL("child: its own registration was not a miss then a hit");
            _exit(0);
        }
        SETUP(pid > 0, "fork");
        alarm(0);
        wait_child(pid, "fork");
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("fork_lock: %d forks finished while the other thread held L across %d registrations\n", rounds, (int)cycles);
    return 0;
}
