/* `mrcache __selftest` without the launcher: run under LD_PRELOAD=libmrcache.so, prints the
 * library's startup self-test report (mrcache_selftest_report). `ci/aarch64 smoke12` runs it
 * with Debian 12's arm64 glibc, which the launcher built in the Debian 13 root cannot load
 * (Rust's std there refers to GLIBC_2.39's pidfd_spawnp and pidfd_getpid); libmrcache.so
 * needs GLIBC_2.34 at most. Exit 0: printed; 3: the library is not preloaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    size_t (*report)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "mrcache_selftest_report");
    if (!report) {
        fprintf(stderr, "selftest_report: libmrcache.so is not preloaded\n");
        return 3;
    }
    static char buf[8192];
    size_t n = report(buf, sizeof buf);
    fwrite(buf, 1, n < sizeof buf ? n : sizeof buf, stdout);
    return 0;
}
