/* Our background threads take their malloc arena before the first registration returns:
 * glibc reserves a new arena's 64 MiB at a thread's first allocation, and one reserved
 * later, while the program frees and allocates big blocks, can take the address the
 * program's next malloc would have reused (seen in the VM: stale.c's free_malloc got "not
 * the same pages"). Counts the arenas malloc_info lists before and right after the first
 * ibv_reg_mr (fake provider). With MRCACHE_LOG=trace the trace writer takes one too.
 *   arena_settled WANT       exit 0 when WANT more arenas exist right after the registration
 *   arena_settled 1 LIB      exit 0 when LIB's constructor saw the drain thread settle
 * The program starts (and joins) a thread of its own first: mrcache starts its threads only
 * in a program that has threads (docs/design/fork.md). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_mr the_mr;
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    return &the_mr;
}
static int fake_dereg(struct ibv_mr *mr) { return 0; }

static int arenas(void) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    malloc_info(0, f);
    fclose(f);
    int n = 0;
    for (char *p = text; (p = strstr(p, "<heap nr=")); p++)
        n++;
    free(text);
    return n;
}

static void *nothing(void *arg) { return arg; }

int main(int argc, char **argv) {
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) || pthread_join(t, NULL))
        return 5;
    if (argc == 3) {
        void *lib = dlopen(argv[2], RTLD_NOW);
        int *sleeping = lib ? dlsym(lib, "drain_sleeping") : NULL;
        if (!sleeping)
            return 4;
        printf("drain thread in its sleep during the constructor: %d\n", *sleeping);
        return *sleeping == 1 ? 0 : 1;
    }
    if (argc != 2)
        return 2;
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    static char buf[1 << 16];
    int before = arenas();
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    int after = arenas();
    if (!mr)
        return 3;
    ibv_dereg_mr(mr);
    printf("arenas: %d before the first registration, %d right after\n", before, after);
    return after - before == atoi(argv[1]) ? 0 : 1;
}
