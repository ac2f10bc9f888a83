/* A program that reads glibc's __curbrk itself: the executable holds a copy of the variable
 * (a copy relocation) and libc's own code keeps that copy, not its original. Under the
 * preload, sbrk and brk must keep the same copy in step, as libc's do. Exit 0: in step. */
#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>

extern void *__curbrk;

int main(void) {
    int failed = 0;
    for (int i = 0; i < 4; i++) {
        char *old = sbrk(4096);
        char *now = sbrk(0);
        if (old == (char *)-1 || now != old + 4096 || __curbrk != now) {
            fprintf(stderr, "FAIL sbrk(4096): returned %p, then sbrk(0) %p, __curbrk %p\n",
                    (void *)old, (void *)now, __curbrk);
            failed = 1;
        }
    }
    char *b = sbrk(0);
    if (brk(b + 8192) != 0 || __curbrk != b + 8192) {
        fprintf(stderr, "FAIL brk(%p): __curbrk %p\n", (void *)(b + 8192), __curbrk);
        failed = 1;
    }
    if (sbrk(-8192) != b + 8192 || __curbrk != b) {
        fprintf(stderr, "FAIL sbrk(-8192): __curbrk %p, want %p\n", __curbrk, (void *)b);
        failed = 1;
    }
    if (!failed)
        printf("curbrk_copy: ok\n");
    return failed;
}
