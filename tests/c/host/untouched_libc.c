/* A process under the preload that never registers memory keeps libc as it was: its code in
 * memory is byte for byte its file (no patched entry point), no thread is started and no
 * atfork handler registered, even after the memory calls the hooks see (malloc and free of
 * small and mmapped blocks, mmap, munmap, madvise, mremap, sbrk, malloc_trim).
 *   untouched_libc idle      those memory calls only
 *   untouched_libc register  the same, then one registration through the fake provider
 *                            behind libmrcache.so and verbs_shim.c (the positive control:
 *                            libc is patched, the atfork handlers are registered)
 * Prints "libc code: B bytes compared, D differ", "threads: N", "engine: N" (the mappings of
 * libmrcache_engine.so in /proc/self/maps) and "atfork: N" (the count of __register_atfork
 * calls made after atfork_count.c's shim, preloaded first; "atfork: no counter" without it). Exit 0 unless something failed to run (3). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

static int memory_calls(void) {
    for (int i = 0; i < 100; i++) free(malloc(16 + i));
    char *big = malloc(64 << 20); /* an mmapped block: free() unmaps it inside libc */
    if (!big) return 3;
    big[0] = 1;
    free(big);
    size_t len = 1 << 20;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 3;
    memset(m, 1, len);
    if (madvise(m, len, MADV_DONTNEED)) return 3;
    char *g = mremap(m, len, 2 * len, MREMAP_MAYMOVE);
    if (g == MAP_FAILED || munmap(g, 2 * len)) return 3;
    if (sbrk(4096) == (void *)-1 || sbrk(-4096) == (void *)-1) return 3;
    malloc_trim(0);
    return 0;
}

/* Bytes of libc's executable mappings that differ from the file they map. */
static int libc_code(long *compared, long *differ) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 3;
    char line[512];
    *compared = *differ = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi, off;
        char perms[8], path[400] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %399s", &lo, &hi, perms, &off, path) < 4) continue;
        const char *base = strrchr(path, '/');
        if (perms[2] != 'x' || !base || strncmp(base + 1, "libc.so", 7)) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return 3;
        static char file[1 << 16];
        for (unsigned long at = lo; at < hi;) {
            size_t n = hi - at < sizeof file ? hi - at : sizeof file;
            ssize_t got = pread(fd, file, n, off + (at - lo));
            if (got <= 0) break;
            for (ssize_t k = 0; k < got; k++) *differ += file[k] != ((const char *)at)[k];
            *compared += got;
            at += got;
        }
        close(fd);
    }
    fclose(maps);
    return *compared ? 0 : 3;
}

static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Lines of /proc/self/maps naming libmrcache_engine.so (-1: unreadable). */
static int engine_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, "/libmrcache_engine.so") != NULL;
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "idle";
    if (memory_calls()) return 3;
    if (!strcmp(mode, "register")) {
        static struct ibv_context ctx;
        static struct ibv_pd pd;
        static char buf[1 << 16];
        ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
        ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
        pd.context = &ctx;
        struct ibv_mr *mr = ibv_reg_mr(&pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
        if (!mr || ibv_dereg_mr(mr)) return 3;
        if (memory_calls()) return 3;
    }
    long compared, differ;
    if (libc_code(&compared, &differ)) return 3;
    printf("libc code: %ld bytes compared, %ld differ\n", compared, differ);
    printf("threads: %d\n", threads());
    printf("engine: %d\n", engine_mappings());
    int (*count)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "atfork_registrations");
    if (count)
        printf("atfork: %d\n", count());
    else
        printf("atfork: no counter\n");
    return 0;
}
