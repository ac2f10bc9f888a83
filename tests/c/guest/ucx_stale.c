/* The stale scenarios of stale.c inside a process where UCX's memory hooks are active:
 * libucs and libucm are dlopen'd (as libucp loads them) and asked for VM_UNMAPPED events
 * before the first registration, which installs UCM's hooks in the mode
 * UCX_MEM_MMAP_HOOK_MODE names (bistro: jumps over libc's entry points; reloc: GOT
 * entries whose "originals" come from dlsym(RTLD_NEXT), past libmrcache.so). Then, under
 * the preload, an unchanged buffer registered again must be a hit (the same lkey: caching
 * stayed on), and the scenario must prove with an RDMA WRITE that a registration after
 * the memory changed reaches the new pages (a stale hit leaves the data in the old ones).
 *
 *   ucx_stale SCENARIO...   (the names of stale.c, run one after another)
 */
#include <ucm/api/ucm.h>

#define main stale_main
#include "stale.c"
#undef main

static int ucx_unmap_events;

static void on_unmap(ucm_event_type_t type, ucm_event_t *ev, void *arg) {
    (void)type, (void)ev, (void)arg;
    __atomic_fetch_add(&ucx_unmap_events, 1, __ATOMIC_RELAXED);
}

static void install_ucx_hooks(void) {
#ifdef UCX_LINKED
    ucs_status_t st = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, on_unmap, NULL);
    CHECK(st == UCS_OK, "UCM would not install its memory hooks (status %d)", (int)st);
#else
    /* libucm needs libucs's symbols; libucs depends on libucm (as when libucp loads them). */
    CHECK(dlopen("libucs.so.0", RTLD_NOW | RTLD_GLOBAL), "dlopen libucs.so.0: %s", dlerror());
    void *ucm = dlopen("libucm.so.0", RTLD_NOW | RTLD_GLOBAL);
    CHECK(ucm, "dlopen libucm.so.0: %s", dlerror());
    void *sym = dlsym(ucm, "ucm_set_event_handler");
    CHECK(sym, "ucm_set_event_handler: %s", dlerror());
    ucs_status_t (*set_handler)(int, int, ucm_event_callback_t, void *);
    memcpy(&set_handler, &sym, sizeof sym);
    ucs_status_t st = set_handler(UCM_EVENT_VM_UNMAPPED, 0, on_unmap, NULL);
    CHECK(st == UCS_OK, "UCM would not install its memory hooks (status %d)", (int)st);
#endif
}

/* Under the preload: registering an unchanged buffer again is a hit (the same lkey), so
 * caching stayed on. Three tries: once in 14 bistro runs the first repeat missed (a new
 * lkey, caching still on; a miss is never unsafe). */
static void expect_hit(void) {
    struct loopback probe;
    CHECK(lb_open(&probe, NULL) == 0, "cannot open the loopback pair");
    size_t len = MIB;
    char *p = map(len);
    uint32_t lkey = 0;
    int hits = 0;
    for (int i = 0; i < 4; i++) {
        struct ibv_mr *mr = ibv_reg_mr(probe.pd, p, len, ACCESS);
        CHECK(mr, "ibv_reg_mr: %s", strerror(errno));
        hits += i > 0 && mr->lkey == lkey;
        lkey = mr->lkey;
        CHECK(lb_prove_write(&probe, mr, p, len, 99 + i) == 0, "the registration must reach the buffer");
        CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    }
    CHECK(hits > 0, "caching is off under UCX's hooks: 4 registrations of one buffer, no hit");
    printf("under UCX's hooks: %d hits in 3 registrations of an unchanged buffer\n", hits);
    CHECK(munmap(p, len) == 0, "munmap");
    lb_close(&probe);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2, "usage: ucx_stale SCENARIO...");
    install_ucx_hooks();
    if (mrcache_loaded())
        expect_hit();
    /* One process for all: UCX's and mrcache's start-up is most of the time under TCG. */
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        char *one[] = {argv[0], argv[i], NULL};
        failed |= stale_main(2, one) != 0;
    }
    printf("UCX saw %d unmap events\n", ucx_unmap_events);
    return failed;
}
