/* Edges of rereg, fork and device memory, in one file: a fake
 * provider (reg, dereg, rereg ops; a translation table per MR) behind libmrcache.so and
 * tests/c/host/rereg_shim.c, and scenarios printing what happened. tests/host/rereg_and_fork_edges.rs runs
 * the ones behind defects once seen and checks their lines:
 *   forkrereg, forkrereg_plain  a fork child's ibv_rereg_mr of the parent's cached MR
 *   forklock N                  _Fork() N times while 2 threads take shadow hits: each child's
 *                               ibv_dereg_mr of the parent's shadow must not reach the provider
 *   rereg_bad                   refused rereg calls set errno
 *   odp                         ON_DEMAND registrations are counted as on-demand
 *   probecost N                 hit costs (printed only: never timed in a test) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <stdatomic.h>

#define LEN 65536ul
static void *_Atomic trans[1<<20];
static atomic_int registrations, provider_deregs, provider_reregs, bad;
static struct ibv_pd pd;
static struct ibv_context ctx;
#define LIVE 4096
static struct ibv_mr *_Atomic live[LIVE];
static int is_live(struct ibv_mr *mr){for(int i=0;i<LIVE;i++) if(mr&&live[i]==mr) return 1; return 0;}
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    for (int i = 0; i < LIVE; i++){ struct ibv_mr *z=NULL; if (atomic_compare_exchange_strong(&live[i],&z,mr)) break;}
    int id = ++registrations; mr->lkey = id; if (id < 1<<20) trans[id] = addr;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++){ struct ibv_mr *m=mr; if (atomic_compare_exchange_strong(&live[i],&m,NULL)) { provider_deregs++; free(mr); return 0; }}
    fprintf(stderr, "exp: PROVIDER asked to deregister %p, not one of its own (handle %u)\n", (void *)mr, mr->handle);
    bad++;
    return EINVAL;
}
static int fake_rereg(struct ibv_mr *mr, int flags, struct ibv_pd *p, void *addr, size_t len, int access) {
    if (!is_live(mr)) { fprintf(stderr, "exp: PROVIDER asked to rereg %p, not its own\n", (void*)mr); bad++; return EINVAL;}
    provider_reregs++; if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) trans[mr->lkey] = addr; return 0;
}
static char *map(void){ char *p = mmap(NULL, LEN, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); if (p==MAP_FAILED) exit(3); return p; }
static struct ibv_mr *reg(void *b, size_t l){ return ibv_reg_mr(&pd, b, l, IBV_ACCESS_LOCAL_WRITE); }
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}

static int seccomp_deny_pvr(unsigned ret) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD|BPF_W|BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP|BPF_JEQ|BPF_K, __NR_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET|BPF_K, ret),
        BPF_STMT(BPF_RET|BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = 4, .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static void twice(void *b, size_t l, const char *what) {
    int before = registrations;
    for (int i = 0; i < 2; i++) { struct ibv_mr *m = reg(b, l); if (!m) { printf("%s: reg failed errno %d\n", what, errno); return; } ibv_dereg_mr(m); }
    printf("%s: %d registrations reached the provider for 2 reg/dereg\n", what, registrations - before);
}

static char *shared_buf; static struct ibv_mr *_Atomic slotmr[64]; static atomic_int stop;
static void *w4(void *arg) {
    long id = (long)arg; unsigned s = id;
    while (!stop) {
        struct ibv_mr *m = reg(shared_buf, LEN);
        if (!m) { bad++; continue; }
        if (rand_r(&s) % 4 == 0) { usleep(1); }
        int rc = ibv_dereg_mr(m);
        if (rc) bad++;
        if (id < 100 && rand_r(&s) % 8 == 0) { int rc2 = ibv_dereg_mr(m); (void)rc2; } /* a double dereg */
    }
    return NULL;
}

static char *rbuf, *rother; static atomic_long wrong, shared_fail, moved;
static void *rr_a(void *x) {
    while (!stop) {
        struct ibv_mr *m = reg(rbuf, LEN); if (!m) continue;
        errno = 0;
        int rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, rother, LEN, 0);
        if (rc == 0) moved++; else shared_fail++;
        ibv_dereg_mr(m);
    }
    return NULL;
}
static void *rr_b(void *x) {
    while (!stop) {
        struct ibv_mr *m = reg(rbuf, LEN); if (!m) continue;
        if (trans[m->lkey] != rbuf) { wrong++; }
        usleep(rand()%3);
        if (trans[m->lkey] != rbuf) { wrong++; }
        ibv_dereg_mr(m);
    }
    return NULL;
}
int main(int argc, char **argv) {
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    ctx.ops._compat_rereg_mr = (void *(*)(void))fake_rereg;
    pd.context = &ctx;
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *s = argv[1];
    if (!strcmp(s, "midnone")) {
        char *b = mmap(NULL, 3*4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
        mprotect(b+4096, 4096, PROT_NONE);
        twice(b, 3*4096, "first+last readable, middle PROT_NONE");
        char *c = mmap(NULL, 3*4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
        munmap(c+4096, 4096);
        twice(c, 3*4096, "middle hole");
        twice(map(), LEN, "control readable");
    } else if (!strcmp(s, "seccomp_eperm") || !strcmp(s, "seccomp_eacces") || !strcmp(s, "seccomp_kill") || !strcmp(s, "seccomp_trap")) {
        unsigned r = !strcmp(s,"seccomp_eperm") ? SECCOMP_RET_ERRNO|EPERM : !strcmp(s,"seccomp_eacces") ? SECCOMP_RET_ERRNO|EACCES : !strcmp(s,"seccomp_kill") ? SECCOMP_RET_KILL_PROCESS : SECCOMP_RET_TRAP;
        if (seccomp_deny_pvr(r)) { perror("seccomp"); return 3; }
        twice(map(), LEN, s);
    } else if (!strcmp(s, "edges")) {
        twice(NULL, 0, "NULL len 0");
        char *b = map();
        twice(b, 0, "len 0");
        twice((void*)0xfffffffffffff000ul, 0x2000, "addr+len overflow");
        twice((void*)0x7ffffffff000ul, 1ul<<40, "huge");
        twice(b, 1, "len 1");
    } else if (!strcmp(s, "probecost")) {
        char *b = map();
        struct ibv_mr *held = reg(b, LEN);
        int n = atoi(argv[2]);
        double t = now();
        for (int i = 0; i < n; i++) { struct ibv_mr *m = reg(b, LEN); ibv_dereg_mr(m); } /* shadow hit: full path */
        double t1 = now();
        for (int i = 0; i < n; i++) { struct ibv_mr *m = reg(b+4096, 4096); ibv_dereg_mr(m); } /* containing hit */
        double t2 = now();
        ibv_dereg_mr(held);
        for (int i = 0; i < n; i++) { struct ibv_mr *m = reg(b, LEN); ibv_dereg_mr(m); } /* fast exact hit */
        double t3 = now();
        printf("shadow hit %.2f us, containing hit %.2f us, fast hit %.3f us; %d provider regs\n", (t1-t)/n*1e6, (t2-t1)/n*1e6, (t3-t2)/n*1e6, registrations);
    } else if (!strcmp(s, "rereg_bad")) {
        int rc = 0; errno = 0;
        printf("rereg(NULL): rc %d errno %d\n", rc, errno);
        char *b = map(); struct ibv_mr *m = reg(b, LEN);
        errno = 0; rc = ibv_rereg_mr(m, 0, NULL, NULL, 0, 0);
        printf("rereg(flags 0) of sole handle: rc %d errno %d provider_reregs %d\n", rc, errno, provider_reregs);
        int before = registrations; struct ibv_mr *m2 = reg(b, LEN);
        printf("  reg of same buffer after: %s (provider regs +%d)\n", m2==m?"got the rereg'd MR":"fresh", registrations-before);
        ibv_dereg_mr(m2); rc = ibv_dereg_mr(m); printf("  dereg of the rereg'd one: %d, live %d\n", rc, is_live(m));
        char *c = map(); struct ibv_mr *h = reg(c, LEN);
        errno = 0; rc = ibv_rereg_mr(h, 0x40, NULL, NULL, 0, 0);
        printf("rereg(bad flags 0x40) of sole handle: rc %d errno %d provider_reregs %d\n", rc, errno, provider_reregs);
        before = registrations; m2 = reg(c, LEN); printf("  reg after: %s (+%d)\n", m2==h?"same":"fresh", registrations-before); ibv_dereg_mr(m2);
        rc = ibv_dereg_mr(h); printf("  dereg: %d live %d\n", rc, is_live(h));
        char *d = map(); struct ibv_mr *p1 = reg(d, LEN), *p2 = reg(d, LEN);
        errno = 0; rc = ibv_rereg_mr(p2, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, map(), LEN, 0);
        printf("rereg of shadow in use: rc %d errno %d\n", rc, errno);
        errno = 0; rc = ibv_rereg_mr(p1, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, map(), LEN, 0);
        printf("rereg of primary while shadow held: rc %d errno %d\n", rc, errno);
        ibv_dereg_mr(p2); ibv_dereg_mr(p1);
        struct ibv_mr *foreign = calloc(1, sizeof *foreign + 64); foreign->context = &ctx;
        errno = 0; rc = ibv_rereg_mr(foreign, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, map(), LEN, 0);
        printf("rereg of foreign MR: rc %d errno %d (provider was asked: bad=%d)\n", rc, errno, bad);
        char *e = map(); struct ibv_mr *q = reg(e, LEN); ibv_dereg_mr(q); rc = ibv_dereg_mr(q);
        printf("double dereg of idle: %d\n", rc);
    } else if (!strcmp(s, "rerace")) {
        rbuf = map(); rother = map(); pthread_t a, b[3]; int nb = atoi(argv[2]);
        pthread_create(&a, 0, rr_a, 0); for (int i = 0; i < nb; i++) pthread_create(&b[i], 0, rr_b, 0);
        usleep(atoi(argv[3])*1000); stop = 1; pthread_join(a, 0); for (int i = 0; i < nb; i++) pthread_join(b[i], 0);
        printf("rerace: moved %ld, refused %ld, hits on a moved MR %ld, provider regs %d deregs %d bad %d\n", moved, shared_fail, wrong, registrations, provider_deregs, bad);
    } else if (!strcmp(s, "w3loop")) {
        int n = atoi(argv[2]), fails = 0, wrongaddr = 0;
        for (int i = 0; i < n; i++) {
            char *old = map(), *fresh = map();
            struct ibv_mr *m = reg(old, LEN);
            munmap(old, LEN);
            usleep(rand() % 25000);
            errno = 0;
            int rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, LEN, 0);
            if (rc) { fails++; if (fails < 3) printf("w3loop %d: rereg rc %d errno %d\n", i, rc, errno); }
            else if (m->addr != fresh || trans[m->lkey] != fresh) wrongaddr++;
            if (ibv_dereg_mr(m)) printf("dereg failed\n");
            munmap(fresh, LEN);
        }
        printf("w3loop: %d iterations, %d rereg failures, %d wrong, provider regs %d deregs %d, bad %d\n", n, fails, wrongaddr, registrations, provider_deregs, bad);
    } else if (!strcmp(s, "forkrereg") || !strcmp(s, "forkrereg_plain")) {
        extern pid_t _Fork(void);
        char *buf = map(), *fresh = map();
        struct ibv_mr *m = reg(buf, LEN), *sh = reg(buf, LEN);
        pid_t pid = !strcmp(s, "forkrereg") ? _Fork() : fork();
        if (pid == 0) {
            int before = provider_reregs;
            errno = 0;
            int rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, LEN, 0);
            printf("child: rereg of the parent's cached MR (shared with a shadow): rc %d errno %d, provider rereg calls %d, MR lkey %u now translates %s\n", rc, errno, provider_reregs - before, m->lkey, trans[m->lkey]==fresh?"the child's new buffer":"the old buffer");
            int d0 = provider_deregs; rc = ibv_dereg_mr(sh);
            printf("child: dereg of the parent's shadow: rc %d provider deregs %d\n", rc, provider_deregs - d0);
            pid_t g = _Fork();
            if (g == 0) { int d1 = provider_deregs; int r = ibv_dereg_mr(m); printf("grandchild: dereg of grandparent's MR: rc %d provider deregs %d\n", r, provider_deregs-d1); _exit(0);} 
            waitpid(g, 0, 0);
            _exit(0);
        }
        waitpid(pid, 0, 0);
        ibv_dereg_mr(sh); ibv_dereg_mr(m);
    } else if (!strcmp(s, "forkremote")) {
        char *buf = map();
        pid_t pid = fork();
        if (pid == 0) {
            int before = registrations;
            for (int i = 0; i < 2; i++) { struct ibv_mr *r = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE); ibv_dereg_mr(r); }
            printf("fork() child: remote reg twice: %d provider regs\n", registrations - before);
            pid_t g = fork();
            if (g == 0) { int b = registrations; for (int i = 0; i < 2; i++) { struct ibv_mr *r = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE); ibv_dereg_mr(r);} printf("fork() grandchild: %d provider regs\n", registrations-b); _exit(0);} 
            waitpid(g,0,0); _exit(0);
        }
        waitpid(pid, 0, 0);
    } else if (!strcmp(s, "remap")) {
        int fd = memfd_create("x", 0); ftruncate(fd, 4*LEN);
        char *b = mmap(NULL, 2*LEN, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
        struct ibv_mr *m = reg(b + 4096, LEN); ibv_dereg_mr(m);
        int before = registrations;
        int rc = remap_file_pages(b + LEN + 100, 4096 + 50, 0, 3, 0); /* unaligned start, inside the registered range's tail */
        m = reg(b + 4096, LEN); ibv_dereg_mr(m);
        printf("remap_file_pages rc %d errno %d: re-registration reached the provider %d time(s) (want 1)\n", rc, errno, registrations - before);
        before = registrations;
        rc = syscall(SYS_remap_file_pages, b, 4096, 0, 2, 0);
        m = reg(b + 4096, LEN); ibv_dereg_mr(m);
        m = reg(b, LEN); ibv_dereg_mr(m);
        printf("raw syscall remap of page 0 rc %d: %d provider regs (outside the cached range of the 1st, the 2nd range is new)\n", rc, registrations-before);
    } else if (!strcmp(s, "odp")) {
        int b = registrations;
        struct ibv_mr *m = ibv_reg_mr(&pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_ON_DEMAND);
        printf("implicit ODP: mr %p, +%d provider regs\n", (void*)m, registrations-b);
        if (m) ibv_dereg_mr(m);
        char *u = mmap(NULL, 1<<20, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); munmap(u, 1<<20);
        m = ibv_reg_mr(&pd, u, 1<<20, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_ON_DEMAND);
        printf("explicit ODP over unmapped: mr %p\n", (void*)m); if (m) ibv_dereg_mr(m);
    } else if (!strcmp(s, "forklock")) {
        extern pid_t _Fork(void);
        shared_buf = map();
        struct ibv_mr *held = reg(shared_buf, LEN), *sh = reg(shared_buf, LEN);
        pthread_t t[2]; for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, w4, (void*)(i+100));
        int n = atoi(argv[2]), errs = 0, calls = 0;
        for (int i = 0; i < n; i++) {
            int pfd[2]; pipe(pfd);
            pid_t pid = _Fork();
            if (pid == 0) {
                int d0 = provider_deregs, b0 = bad;
                int rc = ibv_dereg_mr(sh);
                char r[2] = { rc ? 'E' : '0', (bad != b0 || provider_deregs != d0) ? 'P' : '0' };
                write(pfd[1], r, 2); _exit(0);
            }
            char r[2] = {0}; read(pfd[0], r, 2); close(pfd[0]); close(pfd[1]);
            waitpid(pid, 0, 0);
            if (r[0] == 'E') errs++;
            if (r[1] == 'P') calls++;
        }
        stop = 1; for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
        printf("forklock: %d _Fork children; child dereg of the parent's shadow failed in %d, reached the provider in %d\n", n, errs, calls);
    } else if (!strcmp(s, "w5dead")) {
        for (int wait = 0; wait < 3; wait++) {
            char *b = map(), *f = map();
            struct ibv_mr *m = reg(b, LEN); ibv_dereg_mr(m);
            munmap(b, LEN);
            if (wait == 1) { struct ibv_mr *o = reg(f, LEN); ibv_dereg_mr(o); }
            if (wait == 2) usleep(100000);
            int r0 = provider_reregs; errno = 0;
            int rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, f, LEN, 0);
            printf("w5dead wait=%d: rereg of released MR over unmapped buffer: rc %d errno %d provider reregs %d bad %d\n", wait, rc, errno, provider_reregs - r0, bad);
        }
    } else if (!strcmp(s, "w4")) {
        shared_buf = map();
        int nt = atoi(argv[2]); pthread_t t[64];
        struct ibv_mr *hold = reg(shared_buf, LEN);
        for (long i = 0; i < nt; i++) pthread_create(&t[i], 0, w4, (void*)i);
        usleep(atoi(argv[3])*1000); stop = 1;
        for (int i = 0; i < nt; i++) pthread_join(t[i], 0);
        ibv_dereg_mr(hold);
        printf("w4: provider regs %d deregs %d, bad %d\n", registrations, provider_deregs, bad);
    }
    return 0;
}
