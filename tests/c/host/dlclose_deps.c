/* dlclose of a plugin also unloads the dependencies only it used: a cached registration of
 * a dependency's static buffer must be invalidated with it. A fake provider counts
 * registrations: a second one after the dlclose means it was reported.
 *   dlclose_deps dep|plug PATH/libplug.so PATH/libdep.so   (0 reported, 1 stale, 77 skipped) */
/* A registered static buffer of libdep.so, loaded only as libplug.so's dependency. dlclose of
 * the plugin unloads both; new memory then lands at the buffer's address. A second provider
 * registration: reported; a cache hit: stale.   dlstale plug|dep  (which handle to dlclose) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
static int regs;
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *a, size_t l, uint64_t i, int acc) { regs++; return calloc(1, sizeof(struct ibv_mr) + 64); }
static int fake_dereg(struct ibv_mr *mr) { free(mr); return 0; }
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    static struct ibv_context ctx; static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg; ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg; pd.context = &ctx;
    void *plug = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!plug) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    char *(*pb)(void) = (char *(*)(void))dlsym(plug, "plug_buf");
    char *buf = pb(); size_t len = 4 * 4096;
    void *dep = NULL;
    if (!strcmp(argv[1], "dep")) { dep = dlopen(argv[3], RTLD_NOW | RTLD_NOLOAD); }
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE); ibv_dereg_mr(mr);
    mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE); ibv_dereg_mr(mr);
    if (regs != 1) { fprintf(stderr, "not cached (%d)\n", regs); return 3; }
    if (dep) { dlclose(plug); dlclose(dep); } else dlclose(plug);
    void *m = mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != buf) { fprintf(stderr, "address not reused (%p vs %p)\n", m, buf); return 77; }
    mr = ibv_reg_mr(&pd, m, len, IBV_ACCESS_LOCAL_WRITE); ibv_dereg_mr(mr);
    printf("dlclose %s: %s\n", argv[1], regs == 2 ? "reported (registered again)" : "NOT reported (stale cache hit)");
    return regs == 2 ? 0 : 1;
}
