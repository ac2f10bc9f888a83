/* A verbs program (fake provider, as tests/c/host/fast_hit.c) whose DT_NEEDED
 * libpatch_hammer.so runs threads through libc's patched entry points:
 *   patch_hammer_verbs early    threads from the library's constructor, running while
 *                               the first registration patches libc
 *   patch_hammer_verbs adopt    libpatcher.so (libfabric memhooks' jump over libc's munmap)
 *                               dlopened first, then the threads (HAMMER_LATE=1), then the
 *                               first registration, which takes munmap's entry back
 * Registers a buffer twice ("hit" or "miss" for the second), then frees it with munmap
 * through the threads' traffic and registers again ("seen" when that missed), and prints
 * the result; the caller reads any "caching is OFF" line. With "maps" after the mode, then
 * prints each writable and executable mapping ("rwx: LINE") and their count ("rwx N").
 * Exit 0: ran; 3: set-up failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void hammer_begin(void);
long hammer_stop(long more);

static int registrations;
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    registrations++;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}
static struct ibv_pd pd;

static int reg_missed(void *buf, size_t len) {
    int before = registrations;
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) exit(3);
    ibv_dereg_mr(mr);
    return registrations > before;
}

int main(int argc, char **argv) {
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    if (argc > 2 && !strcmp(argv[1], "adopt")) {
        if (!dlopen(argv[2], RTLD_NOW)) {
            fprintf(stderr, "%s\n", dlerror());
            return 3;
        }
        hammer_begin();
    }
    size_t len = 1 << 20;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 3;
    reg_missed(buf, len);
    int hit = !reg_missed(buf, len);
    if (munmap(buf, len)) return 3;
    char *again = mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    int seen = again == buf ? reg_missed(again, len) : 1;
    long rounds = hammer_stop(3);
    printf("%s %s %s\n", hit ? "hit" : "miss", seen ? "seen" : "STALE", rounds > 0 ? "ran" : "idle");
    if (argc > 2 && !strcmp(argv[2], "maps")) {
        FILE *maps = fopen("/proc/self/maps", "r");
        char line[512];
        int rwx = 0;
        while (maps && fgets(line, sizeof line, maps)) {
            char *perms = strchr(line, ' ');
            if (perms && !strncmp(perms + 1, "rwx", 3)) {
                printf("rwx: %s", line);
                rwx++;
            }
        }
        printf("rwx %d\n", rwx);
    }
    return 0;
}
