/* Non-verbs program linked with libpatch_hammer.so (threads running libc's patched entry
 * points while libmrcache.so's constructor runs). Prints "ok" and exits 0 when every thread
 * ran on and stopped. */
#include <stdio.h>
long hammer_stop(long more);
int main(void) {
    long n = hammer_stop(3);
    printf("ok %s\n", n > 0 ? "ran" : "idle");
    return 0;
}
