/* ibv_rereg_mr of handles the cache handed out, on the host with a fake
 * provider (ibv_context ops that track the objects they hand out) and, behind libmrcache.so,
 * rereg_shim.so (libibverbs' reg/dereg/rereg for calls passed through).
 *   rereg_handles undrained  the app's only handle, its buffer unmapped just before:
 *                         IBV_REREG_MR_CHANGE_TRANSLATION to a new buffer works
 *   rereg_handles drained    the same once the unmap was drained (a verbs call in between)
 *   rereg_handles late       the same 150 ms after the unmap (the background drain's turn)
 *   rereg_handles idle       rereg of an MR the app released and the cache holds idle: EINVAL,
 *                         IBV_REREG_MR_ERR_INPUT, the cached MR unchanged, no provider call
 *   rereg_handles shadow     the same for a released shadow copy
 * exit 0: right; 1: wrong (printed); 3: set-up failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN 65536ul
#define LIVE 64
static struct ibv_mr *live[LIVE];
static int registrations, provider_reregs;
static struct ibv_pd pd;

static int is_live(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (mr && live[i] == mr) return 1;
    return 0;
}

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    for (int i = 0; i < LIVE; i++)
        if (!live[i]) {
            live[i] = mr;
            break;
        }
    registrations++;
    return mr;
}

static int fake_dereg(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (live[i] == mr) {
            live[i] = NULL;
            free(mr);
            return 0;
        }
    fprintf(stderr, "rereg_handles: the provider was asked to deregister %p, not one of its own\n", (void *)mr);
    exit(1);
}

static int fake_rereg(struct ibv_mr *mr, int flags, struct ibv_pd *p, void *addr, size_t len, int access) {
    (void)flags, (void)p, (void)addr, (void)len, (void)access;
    if (!is_live(mr)) {
        fprintf(stderr, "rereg_handles: the provider was asked to rereg %p, not one of its own\n", (void *)mr);
        exit(1);
    }
    provider_reregs++;
    return 0;
}

static char *map(void) {
    char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) exit(3);
    return p;
}

static struct ibv_mr *reg(char *buf) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) {
        fprintf(stderr, "rereg_handles: ibv_reg_mr failed\n");
        exit(3);
    }
    return mr;
}

static void dereg(struct ibv_mr *mr) {
    if (ibv_dereg_mr(mr)) {
        fprintf(stderr, "rereg_handles: ibv_dereg_mr(%p) failed\n", (void *)mr);
        exit(1);
    }
}

/* The app's only handle on a buffer it then unmaps, moved to a new buffer. */
static int moved(const char *how) {
    char *old = map(), *fresh = map(), *other = map();
    struct ibv_mr *mr = reg(old);
    if (munmap(old, LEN)) return 3;
    if (!strcmp(how, "drained"))
        dereg(reg(other)); /* a miss takes the lock and drains the unmap */
    else if (!strcmp(how, "late"))
        usleep(150 * 1000);
    errno = 0;
    int rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, LEN, 0);
    if (rc != 0 || mr->addr != fresh || mr->length != LEN || provider_reregs != 1) {
        fprintf(stderr, "rereg_handles: %s: rereg of the only handle after munmap: %d (errno %d), addr %s, %d provider rereg\n",
                how, rc, errno, mr->addr == fresh ? "moved" : "not moved", provider_reregs);
        return 1;
    }
    int before = registrations;
    struct ibv_mr *again = reg(fresh);
    if (again == mr || registrations != before + 1) {
        fprintf(stderr, "rereg_handles: %s: the rereg'd MR was handed out again\n", how);
        return 1;
    }
    dereg(again);
    dereg(mr);
    if (is_live(mr)) {
        fprintf(stderr, "rereg_handles: %s: the app's ibv_dereg_mr left the rereg'd MR registered\n", how);
        return 1;
    }
    printf("%s: rereg after munmap moved the only handle\n", how);
    return 0;
}

/* ibv_rereg_mr of a handle the app released: a double release, nothing reaches the
 * provider or libibverbs, the cached registration still covers its buffer. */
static int released(const char *what) {
    int *shim_reregs = dlsym(RTLD_DEFAULT, "shim_reregs");
    if (!shim_reregs) {
        fprintf(stderr, "rereg_handles: rereg_shim.so is not preloaded\n");
        return 3;
    }
    char *buf = map(), *fresh = map();
    struct ibv_mr *cached = reg(buf), *handle = cached, *held = NULL;
    dereg(cached);
    if (reg(buf) != cached) return 3; /* cached (and the hit opens the fast path) */
    if (!strcmp(what, "shadow")) {
        held = cached;
        handle = reg(buf); /* a second user: a shadow copy */
        if (handle == cached) return 3;
        dereg(handle);
    } else {
        dereg(cached);
    }
    errno = 0;
    int rc = ibv_rereg_mr(handle, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, LEN, 0);
    int err = errno;
    if (rc != IBV_REREG_MR_ERR_INPUT || err != EINVAL || *shim_reregs != 0 || provider_reregs != 0) {
        fprintf(stderr, "rereg_handles: %s: rereg of a released handle: %d (errno %d), %d passed to libibverbs, %d provider rereg\n",
                what, rc, err, *shim_reregs, provider_reregs);
        return 1;
    }
    if (held) dereg(held);
    struct ibv_mr *hit = reg(buf);
    if (hit != cached || hit->addr != buf || !is_live(cached)) {
        fprintf(stderr, "rereg_handles: %s: after the rereg a registration of the old buffer got %p covering %p (cached %p, buffer %p)\n",
                what, (void *)hit, hit->addr, (void *)cached, (void *)buf);
        return 1;
    }
    dereg(hit);
    printf("%s: rereg of a released handle refused, cache intact\n", what);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    ctx.ops._compat_rereg_mr = (void *(*)(void))fake_rereg;
    pd.context = &ctx;
    if (!strcmp(argv[1], "undrained") || !strcmp(argv[1], "drained") || !strcmp(argv[1], "late"))
        return moved(argv[1]);
    if (!strcmp(argv[1], "idle") || !strcmp(argv[1], "shadow")) return released(argv[1]);
    return 2;
}
