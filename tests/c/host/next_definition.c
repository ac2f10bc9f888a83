/* How a memory hook finds the next definition of its name (sys::elf::next_after_own):
 *   next_definition dlerror   a failed dlsym, then the first mmap and munmap (the hooks' first
 *                             calls), then dlerror(): "dlerror: kept|(null)". Linked against
 *                             next_definition_sysv.so, a library with only a SysV hash table,
 *                             which sits between libmrcache.so and libc in the search.
 *   next_definition unmap     ten pages mapped and unmapped: "unmap: N of 10 gone, munmap
 *                             returned R" (R: the first return value that was not 0, else 0)
 * exit 0 (the line says what happened). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

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
