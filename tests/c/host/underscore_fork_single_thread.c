/* _Fork() in a program that starts no threads, while cached entries are invalidated and
 * deregistered: its children may call malloc (no other thread can hold the allocator's
 * lock), and must never hang there. Each round maps BUFS pages, registers and deregisters
 * each (cached, idle), unmaps them (the entries die, and wait for the drain), then
 * _Fork()s PER_ROUND times, one child at a time, while the drain may run (a drain thread's
 * cycle is 20 ms): each child callocs and mallocs and _exit(0)s; the parent waits for it at
 * most 2 s, then kills it and counts a hang. The fake provider's registration allocates
 * BLOCKS blocks of 2 KiB (too big for glibc's per-thread cache, so freeing them takes the
 * arena's lock) that its deregistration frees, then trims the heap (malloc_trim holds each
 * arena's lock while it gives pages back): a drain that deregisters on a thread of its own
 * spends much of its work in the allocator. Before the forks and after the last, the
 * process must still be single-threaded (/proc/self/task, glibc's __libc_single_threaded),
 * and at the end every dead entry deregistered (by the call that follows them).
 *   underscore_fork_single_thread FORKS */
#include "fork_fake.h"

#include <dirent.h>
#include <malloc.h>
#include <sys/single_threaded.h>

#define BUFS 16
#define BLOCKS 64
#define PER_ROUND 40

struct alloc_mr {
    struct ibv_mr mr;
    void *blocks[BLOCKS];
};

static atomic_int live;

static struct ibv_mr *alloc_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)iova, (void)access;
    struct alloc_mr *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    for (int i = 0; i < BLOCKS; i++)
        m->blocks[i] = malloc(2048);
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = m->mr.rkey = (uint32_t)++registrations;
    live++;
    return &m->mr;
}

static int alloc_dereg(struct ibv_mr *mr) {
    struct alloc_mr *m = (struct alloc_mr *)mr;
    for (int i = 0; i < BLOCKS; i++)
        free(m->blocks[i]);
    free(m);
    malloc_trim(0);
    deregistrations++;
    live--;
    return 0;
}

/* Threads in this process, by /proc/self/task. */
static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    SETUP(d, "opendir /proc/self/task");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void single_threaded(const char *when) {
    int n = threads();
    if (n != 1 || !__libc_single_threaded)
        FAIL("%s: the program started no thread, yet has %d (__libc_single_threaded %d)", when, n,
             (int)__libc_single_threaded);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int forks = atoi(argv[1]);
    fake_open();
    ctx.ops._compat_reg_mr = (void *(*)(void))alloc_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))alloc_dereg;
    alarm(120);
    single_threaded("at the start");
    int hung = 0, f = 0, rounds = 0;
    while (f < forks) {
        char *p[BUFS];
        for (int i = 0; i < BUFS; i++) {
            p[i] = map(LEN);
            dereg(reg(p[i], LEN));
        }
        for (int i = 0; i < BUFS; i++)
            munmap(p[i], LEN);
        if (rounds++ == 1)
            single_threaded("after a round of registrations (the drain's work due)");
        /* Forks while the dead entries wait for the drain (at most a cycle or two). */
        for (int k = 0; k < PER_ROUND && f < forks; k++, f++) {
            pid_t pid = _Fork();
            if (pid == 0) {
                void *a = calloc(1, 4096), *b = malloc(100000);
                free(b);
                free(a);
                _exit(0);
            }
            SETUP(pid > 0, "_Fork");
            int st = 0, waited = 0;
            pid_t r;
            while ((r = waitpid(pid, &st, WNOHANG)) == 0 && waited < 2000) {
                usleep(waited ? 1000 : 50);
                waited++;
            }
            if (r == 0) {
                kill(pid, SIGKILL);
                waitpid(pid, &st, 0);
                hung++;
                fprintf(stderr, "fork %d: the child hung\n", f);
            } else if (r != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
                FAIL("fork %d: the child failed (status %#x)", f, st);
            }
        }
    }
    /* One call a cycle later: it drains the last round's dead entries. */
    usleep(30000);
    char *last = map(LEN);
    dereg(reg(last, LEN));
    single_threaded("after the forks");
    alarm(0);
    printf("underscore_fork_single_thread: %d forks, %d children hung; %d registrations, %d deregistrations\n",
           forks, hung, (int)registrations, (int)deregistrations);
    if (hung) FAIL("%d of %d _Fork children hung", hung, forks);
    if (deregistrations != registrations - 1)
        FAIL("%d of %d registrations deregistered (all but the last, idle, expected)",
             (int)deregistrations, (int)registrations);
    return 0;
}
