/* A malloc/free-heavy program (no verbs): 4 million allocations of mixed sizes, one in
 * 64 large enough to be mmapped and unmapped by glibc. Used by ci/bench to measure what
 * the preload costs a program that never touches verbs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    unsigned seed = 1;
    void *keep[256] = {0};
    unsigned long sum = 0;
    for (int i = 0; i < 4000000; i++) {
        size_t n = (i % 64 == 0) ? 256 * 1024 + (rand_r(&seed) % 4096) : 16 + rand_r(&seed) % 2048;
        int slot = rand_r(&seed) % 256;
        free(keep[slot]);
        keep[slot] = malloc(n);
        memset(keep[slot], i, 16);
        sum += ((unsigned char *)keep[slot])[0];
    }
    for (int i = 0; i < 256; i++)
        free(keep[i]);
    printf("%lu\n", sum);
    return 0;
}
