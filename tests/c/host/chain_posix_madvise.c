/* posix_madvise returns the error number and leaves errno alone (POSIX; glibc does).
 * errno is preset to a sentinel before each failing call. Exit 0: as glibc; 1: not. */
#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>

#define SENTINEL 12345

int main(void) {
    int bad = 0;
    /* An unaligned address (EINVAL) and an unknown advice (EINVAL). */
    struct { void *addr; int advice; } cases[] = {
        {(void *)(4096 * 16 + 1), POSIX_MADV_WILLNEED},
        {(void *)(4096 * 16), 1000},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        errno = SENTINEL;
        int rc = posix_madvise(cases[i].addr, 4096, cases[i].advice);
        int e = errno;
        printf("posix_madvise case %u: returned %d, errno %d\n", i, rc, e);
        if (rc != EINVAL || e != SENTINEL) bad = 1;
    }
    return bad;
}
