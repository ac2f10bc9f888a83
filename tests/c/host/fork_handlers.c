/* fork() in a program whose own pthread_atfork handlers make verbs calls. They are
 * registered before the program's first verbs call (which registers mrcache's), so their
 * prepare runs after mrcache's and their parent and child handlers before mrcache's: no lock
 * of mrcache's may be held there.
 *   fork_handlers WHERE WHAT   WHERE: prepare | parent | child; WHAT, done in that handler:
 *     reg      ibv_reg_mr of a new buffer (and its ibv_dereg_mr)
 *     dead     ibv_dereg_mr of a cached registration whose memory went away while in use
 *     shadow   ibv_dereg_mr of a shadow (a containing hit's own ibv_mr copy)
 *   (in the child, dead and shadow must succeed without reaching the provider: the
 *   parent's registrations are discarded, not deregistered)
 * Each fork must finish, the handler's calls succeed, the parent's cache keep working and
 * the child serve its own registrations (a miss, then a hit).
 *   fork_handlers guarantees flush|keep  (no verbs calls in the handlers but the prepare's
 *     release) with MRCACHE_FORK=flush: an idle entry, one the program's prepare handler
 *     turned idle (after mrcache's prepare) and one it registered there are all misses in
 *     the parent after the fork; with keep the idle one is a hit. In both, the child's
 *     registration of the parent's idle buffer is a miss, its second a hit.
 *   fork_handlers dontfork   (RDMAV_FORK_SAFE=1) the range of an entry in use is given to
 *     ibv_dontfork_range before the program's prepare handler runs, and to ibv_dofork_range
 *     once after the fork in the parent (after the program's parent handler). */
#include "fork_fake.h"

static const char *where, *what;
static char *buf_new, *buf_dead, *buf_shadow;
static struct ibv_mr *mr_dead, *mr_shadow;
static volatile int done_rc = -1; /* what the handler's calls gave: 0 all fine */

static void act(const char *here) {
    if (strcmp(where, here)) return;
    int rc = 0;
    if (!strcmp(what, "reg")) {
        struct ibv_mr *m = ibv_reg_mr(&pd, buf_new, LEN, IBV_ACCESS_LOCAL_WRITE);
        rc = !m || ibv_dereg_mr(m);
    } else {
        int before = deregistrations;
        rc = ibv_dereg_mr(!strcmp(what, "dead") ? mr_dead : mr_shadow);
        /* In the child, the parent's registrations are the parent's: discarded, never
         * deregistered (a shadow is not even the provider's object). */
        if (!rc && !strcmp(here, "child") && deregistrations != before) rc = -2;
    }
    done_rc = rc;
}

static void prepare(void) { act("prepare"); }
static void parent(void) { act("parent"); }
static void child(void) {
    alarm(5); /* first: a hang in mrcache's child handler, which runs after this one */
    act("child");
}

static int handlers(void) {
    SETUP(!pthread_atfork(prepare, parent, child), "pthread_atfork");
    fake_open();
    char *b = map(2 * LEN);
    buf_new = map(LEN), buf_dead = map(LEN), buf_shadow = map(2 * LEN);
    /* The first verbs call: the library sets up and registers its handlers. */
    SETUP(cycle_missed(b, LEN) && !cycle_missed(b, LEN), "the cache did not keep a registration");
    mr_dead = reg(buf_dead, LEN);
    SETUP(!munmap(buf_dead, LEN), "munmap"); /* dead, in use */
    dereg(reg(buf_shadow, 2 * LEN));          /* idle: the next is a containing hit */
    mr_shadow = reg(buf_shadow, LEN);
    alarm(5);
    pid_t pid = fork();
    if (pid == 0) {
        if (!strcmp(where, "child") && done_rc != 0)
            FAIL("child: the child handler's %s call failed (%d)", what, done_rc);
        char *c = map(LEN);
        if (!cycle_missed(c, LEN) || cycle_missed(c, LEN))
            FAIL("child: the child's own registration was not a miss then a hit");
        _exit(0);
    }
    SETUP(pid > 0, "fork: %s", strerror(errno));
    alarm(0);
    if (strcmp(where, "child") && done_rc != 0)
        FAIL("the %s handler's %s call failed (%d)", where, what, done_rc);
    wait_child(pid, "fork");
    if (strcmp(where, "parent") && strcmp(where, "prepare")) {
        /* The handler ran only in the child: release here what it released there. */
        if (!strcmp(what, "dead")) dereg(mr_dead);
        if (!strcmp(what, "shadow")) dereg(mr_shadow);
    }
    if (cycle_missed(b, LEN) && cycle_missed(b, LEN))
        FAIL("the parent's cache no longer keeps registrations");
    printf("fork_handlers %s %s: the fork finished, the calls succeeded\n", where, what);
    return 0;
}

static struct ibv_mr *turned_idle;
static char *turned_idle_buf, *registered_buf;

static void prepare_releases(void) {
    /* After mrcache's prepare handler: a release and a registration in the fork's window. */
    dereg(turned_idle);
    dereg(reg(registered_buf, LEN));
}
static void child_alarm(void) { alarm(5); }

static int guarantees(const char *mode) {
    int flush = !strcmp(mode, "flush");
    SETUP(!pthread_atfork(prepare_releases, NULL, child_alarm), "pthread_atfork");
    fake_open();
    char *b = map(LEN);
    turned_idle_buf = map(LEN), registered_buf = map(LEN);
    SETUP(cycle_missed(b, LEN) && !cycle_missed(b, LEN), "the cache did not keep a registration");
    for (int round = 0; round < 10; round++) {
        turned_idle = reg(turned_idle_buf, LEN);
        /* Idle and cached. */
        cycle_missed(b, LEN);
        SETUP(!cycle_missed(b, LEN), "round %d: the idle entry is not cached", round);
        alarm(5);
        pid_t pid = fork();
        if (pid == 0) {
            if (!cycle_missed(b, LEN))
                FAIL("child: a registration of the parent's idle buffer hit the parent's entry");
            if (cycle_missed(b, LEN))
                FAIL("child: its own registration was not cached");
            _exit(0);
        }
        SETUP(pid > 0, "fork");
        alarm(0);
        int idle = cycle_missed(b, LEN), released = cycle_missed(turned_idle_buf, LEN),
            registered = cycle_missed(registered_buf, LEN);
        if (flush && (!idle || !released || !registered))
            FAIL("round %d, MRCACHE_FORK=flush: hit after the fork in the parent:%s%s%s", round,
                 idle ? "" : " the entry idle before the fork",
                 released ? "" : " the entry released in the fork's window",
                 registered ? "" : " the registration made in the fork's window");
        if (!flush && idle)
            FAIL("round %d, MRCACHE_FORK=keep: the idle entry was not kept across the fork", round);
        wait_child(pid, "fork");
    }
    printf("fork_handlers guarantees %s: kept\n", mode);
    return 0;
}

static struct ibv_mr *in_use;
static char *in_use_buf;
static int dontforks_at_prepare = -1, doforks_at_parent = -1;
static int *dontforks, *doforks;

static void prepare_look(void) { dontforks_at_prepare = *dontforks; }
static void parent_look(void) { doforks_at_parent = *doforks; }

static int dontfork(void) {
    SETUP(!pthread_atfork(prepare_look, parent_look, child_alarm), "pthread_atfork");
    fake_open();
    dontforks = shim_int("shim_dontforks"), doforks = shim_int("shim_doforks");
    uintptr_t *dontfork_base = dlsym(RTLD_DEFAULT, "shim_dontfork_base"),
              *dofork_base = dlsym(RTLD_DEFAULT, "shim_dofork_base");
    in_use_buf = map(LEN);
    in_use = reg(in_use_buf, LEN);
    int d0 = *dontforks, f0 = *doforks;
    alarm(5);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    SETUP(pid > 0, "fork");
    alarm(0);
    wait_child(pid, "fork");
    if (dontforks_at_prepare != d0 + 1 || *dontfork_base != (uintptr_t)in_use_buf)
        FAIL("the in-use range was not marked DONTFORK before the program's prepare handler: %d calls, last %#lx (buffer %p)",
             dontforks_at_prepare - d0, (unsigned long)*dontfork_base, (void *)in_use_buf);
    if (doforks_at_parent != f0 || *doforks != f0 + 1 || *dofork_base != (uintptr_t)in_use_buf)
        FAIL("DOFORK in the parent: %d before the program's parent handler, %d after the fork (want 0, 1)",
             doforks_at_parent - f0, *doforks - f0);
    dereg(in_use);
    printf("fork_handlers dontfork: marked and unmarked once\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    where = argv[1], what = argv[2];
    if (!strcmp(where, "guarantees")) return guarantees(what);
    if (!strcmp(where, "dontfork")) return dontfork();
    return handlers();
}
