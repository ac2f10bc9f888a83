/* A preloaded library whose constructor moves the program break before libmrcache.so's
 * constructor has run (listed after it in LD_PRELOAD, so its constructor runs first), as an
 * allocator's early initialisation may. libc's sbrk keeps the break in __curbrk; a brk
 * replacement that does not keep it in step leaves sbrk (and so malloc) working from a stale
 * break, which can shrink the heap under live objects. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void fail(const char *what) {
    write(2, what, strlen(what));
    write(2, "\n", 1);
    _exit(3);
}

__attribute__((constructor)) static void early(void) {
    char *b = sbrk(0);
    if (b == (char *)-1) fail("early_brk: sbrk(0) failed");
    if (brk(b + 65536) != 0) fail("early_brk: brk grow failed");
    if ((char *)sbrk(0) != b + 65536) fail("early_brk: sbrk(0) after brk() grow is stale: __curbrk not updated");
    if (brk(b) != 0) fail("early_brk: brk shrink failed");
    if ((char *)sbrk(0) != b) fail("early_brk: sbrk(0) after brk() shrink is stale: __curbrk not updated");
}
