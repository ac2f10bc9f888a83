// A program with its own pthread_atfork handlers and no verbs. Three handler sets (glibc
// runs prepare handlers in reverse order of registration, parent and child handlers in
// order); each handler allocates and frees a large block (mmap/munmap inside the handler)
// and logs its name into a per-process log. Four threads take turns (a fixed schedule)
// forking five times each; the child prints its log and exits with the fork's number, the
// parent waits for it, then prints its own log: the whole output is deterministic. Then
// the four threads fork concurrently, 10 times each, and only counts are printed.
// Exit status 3 (so a changed status is seen), or 1 with a line naming the check.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 4
#define TURNS 5
#define FREE_FORKS 10

static char log_buf[4096];
static size_t log_len;
static __thread int logging;  // the handlers run in the forking thread (and its child)
static long prepares, parents;
static int failures;

static void note(const char *s) {
    if (!logging)
        return;
    size_t n = strlen(s);
    if (log_len + n + 1 < sizeof log_buf) {
        memcpy(log_buf + log_len, s, n);
        log_len += n;
        log_buf[log_len++] = ' ';
    }
}

// Each handler touches the allocator and the memory calls, as real ones (a logging
// library's, an MPI's) do.
static void churn(void) {
    void *p = malloc(1 << 20);  // mmapped by malloc, unmapped by free
    if (p)
        memset(p, 1, 4096);
    free(p);
    void *m = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || madvise(m, 65536, MADV_DONTNEED) != 0 || munmap(m, 65536) != 0)
        __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
}

#define HANDLERS(n)                                                                        \
    static void prepare##n(void) {                                                         \
        churn();                                                                           \
        note("prepare" #n);                                                                \
        if (n == 1)                                                                        \
            __atomic_add_fetch(&prepares, 1, __ATOMIC_RELAXED);                            \
    }                                                                                      \
    static void parent##n(void) {                                                          \
        churn();                                                                           \
        note("parent" #n);                                                                 \
        if (n == 1)                                                                        \
            __atomic_add_fetch(&parents, 1, __ATOMIC_RELAXED);                             \
    }                                                                                      \
    static void child##n(void) {                                                           \
        churn();                                                                           \
        note("child" #n);                                                                  \
    }
HANDLERS(1)
HANDLERS(2)
HANDLERS(3)

static void flush_log(const char *who, int k) {
    char line[4200];
    int n = snprintf(line, sizeof line, "%s %d: %.*s\n", who, k, (int)log_len, log_buf);
    if (write(1, line, (size_t)n) != n)
        __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    log_len = 0;
}

static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cv = PTHREAD_COND_INITIALIZER;
static int turn;  // fork number k is made by thread k % THREADS
static pthread_barrier_t start;

static int fork_and_wait(int k, int expect_log) {
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (expect_log)
            flush_log("child", k);
        _exit(k & 0x7f);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != (k & 0x7f))
        return -1;
    return 0;
}

static void *thread_main(void *arg) {
    int id = (int)(long)arg;
    // Phase 1: a fixed schedule, one fork at a time.
    for (int i = 0; i < TURNS; i++) {
        int k = i * THREADS + id;
        pthread_mutex_lock(&turn_lock);
        while (turn != k)
            pthread_cond_wait(&turn_cv, &turn_lock);
        log_len = 0;
        logging = 1;
        if (fork_and_wait(k, 1) != 0) {
            fprintf(stderr, "fork %d (thread %d) failed\n", k, id);
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
        }
        logging = 0;
        flush_log("parent", k);
        turn++;
        pthread_cond_broadcast(&turn_cv);
        pthread_mutex_unlock(&turn_lock);
    }
    // Phase 2: every thread forks at once.
    pthread_barrier_wait(&start);
    for (int i = 0; i < FREE_FORKS; i++)
        if (fork_and_wait(100 + id * FREE_FORKS + i, 0) != 0) {
            fprintf(stderr, "free fork %d of thread %d failed\n", i, id);
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
        }
    return NULL;
}

int main(void) {
    if (pthread_atfork(prepare1, parent1, child1) || pthread_atfork(prepare2, parent2, child2) ||
        pthread_atfork(prepare3, parent3, child3)) {
        fprintf(stderr, "pthread_atfork failed\n");
        return 1;
    }
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, thread_main, (void *)i) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("forks %d, prepare handlers %ld, parent handlers %ld\n",
           THREADS * (TURNS + FREE_FORKS), prepares, parents);
    if (failures) {
        printf("failures: %d\n", failures);
        return 1;
    }
    return 3;
}
