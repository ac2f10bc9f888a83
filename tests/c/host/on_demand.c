/* On-demand entries (MRCACHE_ODP) against a fake extended context behind libmrcache.so and
 * on_demand_shim.so: a `struct verbs_context` whose query_device_ex op says whether the
 * device pages RC send, receive, write and read on demand, and whose reg op refuses
 * IBV_ACCESS_ON_DEMAND with EOPNOTSUPP where it does not (as the kernel does).
 *   on_demand reopen   a 1 MiB registration on an ODP device's context, ibv_close_device, then
 *                      another device without ODP whose context the allocator put at the same
 *                      address: "reopen: mr ok|NULL errno E"
 *   on_demand verify   register, deregister (idle), munmap, new pages mapped at the same
 *                      address, register again: "verify: provider registrations R (on demand O)"
 *   on_demand blind_on the first pair on a device without ODP (it sets the library up), then
 *                      five pairs on the ODP device (MRCACHE_MONITOR=symbols: blind):
 *                      "blind_on: provider registrations on the ODP device R of 5"
 *   on_demand evict    five rounds of a pair on the ODP device and a pair on a second device
 *                      without ODP (MRCACHE_MAX_ENTRIES=1): "evict: provider registrations on
 *                      the ODP device R of 5"
 *   on_demand memlock  a 1 MiB registration on a device that pages every transport on demand
 *                      and refuses to pin it (ENOMEM, as the memlock limit does):
 *                      "memlock: mr ok|NULL errno E (on demand O)"
 *   on_demand sizes D  two pairs each of 4 KiB, 64 KiB and 1 MiB on device D (4: Mellanox's
 *                      vendor id, 5: rxe's; both page every transport on demand and pin too):
 *                      "sizes: on demand: none|SIZE..." (the sizes registered ON_DEMAND),
 *                      "registrations: R of 6 pairs" (those that reached the provider)
 *   on_demand remote   a 1 MiB pair with remote write, then one local, on device 4:
 *                      "remote: on demand: remote R, local L" (registrations made ON_DEMAND)
 *   on_demand transient three 1 MiB pairs on device 4 whose first on-demand registration
 *                      fails with ENOMEM: "transient: registrations R (on demand O)"
 *   on_demand refused  five 1 MiB pairs on a device whose capabilities say it pages the RC
 *                      transport on demand but whose reg op refuses ON_DEMAND (EINVAL, as a
 *                      kernel with ODP turned off does): "refused: mr ok|NULL errno E,
 *                      provider registrations R of 5 (on demand O)"
 * exit 0; 3: a call that must work failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The context's cmd_fd (unused here) says whether its device pages on demand: 0 no, 1 the
 * RC transport, 2 every transport (and then it pins nothing: ENOMEM without ON_DEMAND), 3 the
 * RC transport by its capabilities, but its reg op refuses ON_DEMAND (EINVAL), 4 every
 * transport, and it pins too, 5 the same with rxe's vendor id. Every other device reports
 * Mellanox's vendor id (0x2c9) and part 4129. */
static struct verbs_context vctx, other;
static struct ibv_pd pd, other_pd;
static int regs, odp_regs, pd_regs;
static size_t odp_lens[8];
static int fail_next_odp; /* errno for the next ON_DEMAND registration, once */

static int query_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
                    struct ibv_device_attr_ex *attr, size_t size) {
    if (c->cmd_fd) {
        attr->odp_caps.general_caps = IBV_ODP_SUPPORT;
        attr->odp_caps.per_transport_caps.rc_odp_caps =
            IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
    }
    attr->orig_attr.vendor_id = c->cmd_fd == 5 ? 0xffffff : 0x2c9;
    attr->orig_attr.vendor_part_id = c->cmd_fd == 5 ? 0 : 4129;
    if (c->cmd_fd == 2 || c->cmd_fd == 4 || c->cmd_fd == 5) {
        attr->odp_caps.per_transport_caps.rc_odp_caps |= IBV_ODP_SUPPORT_SRQ_RECV;
        attr->odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
    }
    return 0;
}

static struct ibv_mr *reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    if ((access & IBV_ACCESS_ON_DEMAND) && !p->context->cmd_fd) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if ((access & IBV_ACCESS_ON_DEMAND) && p->context->cmd_fd == 3) {
        errno = EINVAL;
        return NULL;
    }
    if ((access & IBV_ACCESS_ON_DEMAND) && fail_next_odp) {
        errno = fail_next_odp;
        fail_next_odp = 0;
        return NULL;
    }
    if (!(access & IBV_ACCESS_ON_DEMAND) && p->context->cmd_fd == 2) {
        errno = ENOMEM;
        return NULL;
    }
    regs++;
    pd_regs += p == &pd;
    if ((access & IBV_ACCESS_ON_DEMAND) && odp_regs < 8) odp_lens[odp_regs] = len;
    odp_regs += !!(access & IBV_ACCESS_ON_DEMAND);
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->addr = addr, mr->length = len;
    return mr;
}

static int dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

/* A device's context at v, laid out as libibverbs lays out an extended one, and its PD. */
static void open_device_at(struct verbs_context *v, struct ibv_pd *p, int odp) {
    memset(v, 0, sizeof *v);
    v->sz = sizeof *v;
    v->query_device_ex = query_ex;
    v->context.cmd_fd = odp;
    v->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    v->context.ops._compat_reg_mr = (void *(*)(void))reg;
    v->context.ops._compat_dereg_mr = (void *(*)(void))dereg;
    p->context = &v->context;
}

static void open_device(int odp) { open_device_at(&vctx, &pd, odp); }

static char *map(void *at, size_t len, int flags) {
    char *b = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (b == MAP_FAILED) exit(3);
    memset(b, 1, len);
    return b;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "reopen";
    size_t len = 1 << 20;
    char *a = map(NULL, len, 0);
    open_device(1);
    if (!strcmp(mode, "blind_on")) {
        open_device_at(&other, &other_pd, 0);
        char *b = map(NULL, len, 0);
        struct ibv_mr *n = ibv_reg_mr(&other_pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        if (!n || ibv_dereg_mr(n)) return 3;
        for (int i = 0; i < 5; i++) {
            struct ibv_mr *m = ibv_reg_mr(&pd, a, len, IBV_ACCESS_LOCAL_WRITE);
            if (!m || ibv_dereg_mr(m)) return 3;
        }
        printf("blind_on: provider registrations on the ODP device %d of 5\n", pd_regs);
        return 0;
    }
    if (!strcmp(mode, "refused")) {
        open_device(3);
        int failed = 0, e = 0;
        for (int i = 0; i < 5; i++) {
            errno = 0;
            struct ibv_mr *n = ibv_reg_mr(&pd, a, len, IBV_ACCESS_LOCAL_WRITE);
            if (!n) {
                failed++, e = errno;
                continue;
            }
            if (ibv_dereg_mr(n)) return 3;
        }
        printf("refused: mr %s errno %d, provider registrations %d of 5 (on demand %d)\n",
               failed ? "NULL" : "ok", e, regs, odp_regs);
        return 0;
    }
    if (!strcmp(mode, "sizes")) {
        open_device(argc > 2 ? atoi(argv[2]) : 4);
        size_t lens[] = {4096, 65536, 1 << 20};
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 2; k++) {
                struct ibv_mr *n = ibv_reg_mr(&pd, a, lens[i], IBV_ACCESS_LOCAL_WRITE);
                if (!n || ibv_dereg_mr(n)) return 3;
            }
        printf("sizes: on demand:%s", odp_regs ? "" : " none");
        for (int i = 0; i < odp_regs && i < 8; i++) printf(" %zu", odp_lens[i]);
        printf("\nregistrations: %d of 6 pairs\n", regs);
        return 0;
    }
    if (!strcmp(mode, "remote")) {
        open_device(4);
        char *b = map(NULL, len, 0);
        struct ibv_mr *n = ibv_reg_mr(&pd, a, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (!n || ibv_dereg_mr(n)) return 3;
        int remote = odp_regs;
        n = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        if (!n || ibv_dereg_mr(n)) return 3;
        printf("remote: on demand: remote %d, local %d\n", remote, odp_regs - remote);
        return 0;
    }
    if (!strcmp(mode, "transient")) {
        open_device(4);
        fail_next_odp = ENOMEM;
        char *b = map(NULL, len, 0), *c = map(NULL, len, 0);
        char *bufs[] = {a, b, c};
        for (int i = 0; i < 3; i++) {
            struct ibv_mr *n = ibv_reg_mr(&pd, bufs[i], len, IBV_ACCESS_LOCAL_WRITE);
            if (!n || ibv_dereg_mr(n)) return 3;
        }
        printf("transient: registrations %d (on demand %d)\n", regs, odp_regs);
        return 0;
    }
    if (!strcmp(mode, "memlock")) {
        open_device(2);
        errno = 0;
        struct ibv_mr *n = ibv_reg_mr(&pd, a, len, IBV_ACCESS_LOCAL_WRITE);
        printf("memlock: mr %s errno %d (on demand %d)\n", n ? "ok" : "NULL", n ? 0 : errno,
               odp_regs);
        if (n && ibv_dereg_mr(n)) return 3;
        return 0;
    }
    struct ibv_mr *m = ibv_reg_mr(&pd, a, len, IBV_ACCESS_LOCAL_WRITE);
    if (!m || ibv_dereg_mr(m)) return 3;
    if (!strcmp(mode, "reopen")) {
        if (ibv_close_device(&vctx.context)) return 3;
        open_device(0);
        char *b = map(NULL, len, 0);
        errno = 0;
        struct ibv_mr *n = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        printf("reopen: mr %s errno %d\n", n ? "ok" : "NULL", n ? 0 : errno);
        if (n && ibv_dereg_mr(n)) return 3;
        return 0;
    }
    if (!strcmp(mode, "verify")) {
        munmap(a, len);
        char *b = map(a, len, MAP_FIXED);
        memset(b, 2, len);
        m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
        printf("verify: provider registrations %d (on demand %d)\n", regs, odp_regs);
        return 0;
    }
    if (!strcmp(mode, "evict")) {
        open_device_at(&other, &other_pd, 0);
        char *b = map(NULL, len, 0);
        for (int i = 0; i < 5; i++) { /* the first pair on pd was made above */
            if (i && (!(m = ibv_reg_mr(&pd, a, len, IBV_ACCESS_LOCAL_WRITE)) || ibv_dereg_mr(m)))
                return 3;
            struct ibv_mr *n = ibv_reg_mr(&other_pd, b, len, IBV_ACCESS_LOCAL_WRITE);
            if (!n || ibv_dereg_mr(n)) return 3;
        }
        printf("evict: provider registrations on the ODP device %d of 5\n", pd_regs);
        return 0;
    }
    return 3;
}
