/* A successful dlsym leaves no error for dlerror() to report, as libc's does, also for the
 * memory functions whose lookups libmrcache.so answers itself (RTLD_NEXT from the program
 * finds its hook next). A failed lookup first leaves an error pending. Exit 0: as expected. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    static const char *names[] = {"munmap", "madvise", "brk",   "mmap",   "mremap",
                                  "shmdt",  "sbrk",    "shmat", "getpid"};
    void *handles[] = {RTLD_NEXT, RTLD_DEFAULT};
    int failed = 0;
    for (int h = 0; h < 2; h++) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (dlsym(RTLD_DEFAULT, "mrc_no_such_symbol") != NULL)
                return 2;
            void *p = dlsym(handles[h], names[i]);
            const char *e = dlerror();
            if (!p || e) {
                fprintf(stderr, "FAIL dlsym(%s, %s): %p, then dlerror() says %s\n",
                        h ? "RTLD_DEFAULT" : "RTLD_NEXT", names[i], p, e ? e : "nothing");
                failed = 1;
            }
        }
    }
    if (!failed)
        printf("dlsym_dlerror: ok\n");
    return failed;
}
