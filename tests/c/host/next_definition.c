/* How a memory hook finds the next definition of its name (sys::elf::next_after_own):
 *   next_definition dlerror   a failed dlsym, then the first mmap and munmap (the hooks' first
 *                             calls), then dlerror(): "dlerror: kept|(null)". Linked against
 *                             next_definition_sysv.so, a library with only a SysV hash table,
 *                             which sits between libmrcache.so and libc in the search.
 *   next_definition unmap     ten pages mapped and unmapped: "unmap: N of 10 gone, munmap
 *                             returned R" (R: the first return value that was not 0, else 0)
 *   next_definition dlopened LIB PLUGIN   LIB (libmrcache.so) loaded with dlopen after libc,
 *                             then PLUGIN, RTLD_LOCAL, whose munmap is its own; a page
 *                             unmapped through LIB's munmap: "dlopened: munmap returned R,
 *                             page gone|STILL MAPPED"
 *   next_definition namespace LIB   LIB dlmopen'ed into a namespace of its own; its realloc
 *                             and _Fork called through its handle: "namespace: realloc
 *                             ok|NULL, _Fork ok|failed"
 * exit 0 (the line says what happened); 3: a call that must work failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int next_definition_sysv_marker(void);

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "dlerror";
    if (!strcmp(mode, "dlerror")) {
        if (next_definition_sysv_marker() != 42) return 3;
        if (dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere")) return 3;
        void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || munmap(p, 4096)) return 3;
        printf("dlerror: %s\n", dlerror() ? "kept" : "(null)");
        return 0;
    }
    if (!strcmp(mode, "dlopened") && argc > 3) {
        void *m = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
        if (!m || !dlopen(argv[3], RTLD_NOW | RTLD_LOCAL)) return 3;
        int (*um)(void *, size_t) = (int (*)(void *, size_t))dlsym(m, "munmap");
        void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (!um || p == MAP_FAILED) return 3;
        int r = um(p, 4096);
        unsigned char v;
        printf("dlopened: munmap returned %d, page %s\n", r, mincore(p, 4096, &v) ? "gone" : "STILL MAPPED");
        return 0;
    }
    if (!strcmp(mode, "namespace") && argc > 2) {
        void *m = dlmopen(LM_ID_NEWLM, argv[2], RTLD_NOW);
        if (!m) return 3;
        void *(*re)(void *, size_t) = (void *(*)(void *, size_t))dlsym(m, "realloc");
        pid_t (*fk)(void) = (pid_t (*)(void))dlsym(m, "_Fork");
        if (!re || !fk) return 3;
        void *p = re(NULL, 100);
        pid_t c = fk();
        if (c == 0) _exit(0);
        if (c > 0) waitpid(c, NULL, 0);
        printf("namespace: realloc %s, _Fork %s\n", p ? "ok" : "NULL", c > 0 ? "ok" : "failed");
        return 0;
    }
    int gone = 0, bad = 0;
    for (int i = 0; i < 10; i++) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 3;
        int r = munmap(p, 4096);
        if (r && !bad) bad = r;
        unsigned char v;
        gone += mincore(p, 4096, &v) != 0; /* ENOMEM: not mapped */
    }
    printf("unmap: %d of 10 gone, munmap returned %d\n", gone, bad);
    return 0;
}
