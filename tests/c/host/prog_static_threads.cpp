// A C++ program whose static objects start std::threads during static initialisation
// (before main) that keep running while main runs: they use new/delete, std::vector
// growth, realloc of mmapped chunks (glibc grows those with mremap), mmap, munmap, mremap
// and madvise, checking every byte they read back. Static destructors stop and join them
// at exit. What it prints depends only on the work, never on timing: each worker's
// checksum over a fixed number of rounds; rounds done beyond those (while waiting for main
// to finish) are checked but not counted; destructors run in reverse order, so the
// workers print 2, 1, 0. Exit status 0, or 1 with a line naming the check that failed.
// Built with -DAS_LIBRARY -shared it is a library whose constructors start the
// threads, and library_main (called by prog_static_threads_main.c) replaces main.
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

constexpr int kRounds = 4;
std::atomic<bool> g_stop{false};
std::atomic<int> g_failures{0};

void fail(const char *what, int worker, int round) {
    char line[160];
    int n = snprintf(line, sizeof line, "worker %d round %d: %s (errno %d)\n", worker, round,
                     what, errno);
    if (write(2, line, n) < 0) {
    }
    g_failures.fetch_add(1);
}

uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

// One round of work, seeded by (worker, round); returns a checksum of what it read back.
uint64_t round_of_work(int w, int r) {
    uint64_t h = 0;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);

    // new/delete of many small objects and one large array (mmapped by malloc).
    {
        std::vector<std::unique_ptr<std::string>> v;
        for (int i = 0; i < 200; i++)
            v.emplace_back(new std::string((size_t)(i % 64) + 1, (char)('a' + (w + i) % 26)));
        for (auto &s : v)
            h = mix(h, s->size() * 31 + (uint8_t)(*s)[0]);
        auto *big = new uint32_t[(1 << 20) / 4 + w * 1024];  // >= 1 MiB: its own mapping
        for (size_t i = 0; i < (1 << 20) / 4; i += 1024)
            big[i] = (uint32_t)(i ^ (uint32_t)r);
        for (size_t i = 0; i < (1 << 20) / 4; i += 1024)
            if (big[i] != (uint32_t)(i ^ (uint32_t)r))
                fail("new[] contents", w, r);
        h = mix(h, big[4096]);
        delete[] big;
    }

    // std::vector growth past the mmap threshold: each growth maps, copies, unmaps.
    {
        std::vector<uint64_t> v;
        for (uint64_t i = 0; i < 300000; i++)
            v.push_back(i * (uint64_t)(w + 1) + (uint64_t)r);
        for (uint64_t i = 0; i < v.size(); i += 997)
            if (v[i] != i * (uint64_t)(w + 1) + (uint64_t)r)
                fail("vector contents", w, r);
        h = mix(h, v.back());
        v.clear();
        v.shrink_to_fit();
    }

    // realloc of an mmapped chunk: glibc moves it with mremap; contents must follow.
    {
        size_t n = 512 * 1024;
        auto *p = static_cast<unsigned char *>(malloc(n));
        if (!p) {
            fail("malloc", w, r);
            return h;
        }
        for (size_t i = 0; i < n; i += 64)
            p[i] = (unsigned char)(i / 64 + w + r);
        for (int step = 0; step < 4; step++) {
            n *= 2;
            auto *q = static_cast<unsigned char *>(realloc(p, n));
            if (!q) {
                fail("realloc", w, r);
                free(p);
                return h;
            }
            p = q;
        }
        for (size_t i = 0; i < 512 * 1024; i += 64)
            if (p[i] != (unsigned char)(i / 64 + w + r))
                fail("realloc contents", w, r);
        h = mix(h, p[4096]);
        p = static_cast<unsigned char *>(realloc(p, 200 * 1024));  // shrink in place
        if (!p || p[64] != (unsigned char)(1 + w + r))
            fail("realloc shrink", w, r);
        free(p);
    }

    // mmap, madvise(DONTNEED) (reads back as zero), mremap (grow, move), munmap of a hole.
    {
        size_t len = 64 * page;
        auto *m = static_cast<unsigned char *>(
            mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (m == MAP_FAILED) {
            fail("mmap", w, r);
            return h;
        }
        memset(m, 0x5a, len);
        if (madvise(m + 8 * page, 8 * page, MADV_DONTNEED) != 0)
            fail("madvise", w, r);
        for (size_t i = 8 * page; i < 16 * page; i += page)
            if (m[i] != 0)
                fail("madvise DONTNEED left data", w, r);
        if (m[0] != 0x5a || m[16 * page] != 0x5a)
            fail("madvise touched other pages", w, r);
        auto *g = static_cast<unsigned char *>(mremap(m, len, 4 * len, MREMAP_MAYMOVE));
        if (g == MAP_FAILED) {
            fail("mremap", w, r);
            munmap(m, len);
            return h;
        }
        if (g[0] != 0x5a || g[len - 1] != 0x5a || g[len] != 0)
            fail("mremap contents", w, r);
        if (munmap(g + page, page) != 0)  // a hole in the middle
            fail("munmap hole", w, r);
        h = mix(h, g[0] + g[2 * page] + g[len]);
        if (munmap(g, 4 * len) != 0)
            fail("munmap", w, r);
    }
    return h;
}

struct Worker {
    int id;
    uint64_t sum = 0;
    std::thread t;
    explicit Worker(int i) : id(i) {
        t = std::thread([this] {
            for (int r = 0; r < kRounds; r++)
                sum = mix(sum, round_of_work(id, r));
            for (int r = kRounds; !g_stop.load(); r++)  // keep going while main runs
                (void)round_of_work(id, r % 1000);
        });
    }
    ~Worker() {
        g_stop.store(true);
        t.join();
        printf("worker %d: %016llx\n", id, (unsigned long long)sum);
    }
};

// Static objects: their threads start during static initialisation, before main.
Worker w0(0), w1(1);
Worker w2(2);

}  // namespace

#ifdef AS_LIBRARY
// Built as libprog_static_threads.so, a DT_NEEDED library of prog_static_threads_main.c:
// its static threads then start in a library constructor, before libmrcache.so's.
extern "C" int library_main() {
#else
int main() {
#endif
    // main's own work, alongside the workers.
    uint64_t h = 0;
    for (int r = 0; r < kRounds; r++)
        h = mix(h, round_of_work(9, r));
    printf("main: %016llx\n", (unsigned long long)h);
    // Stop the workers only after their counted rounds; destructors join (reverse order).
    g_stop.store(true);
    if (g_failures.load() != 0) {
        printf("failures: %d\n", g_failures.load());
        fflush(stdout);
        _exit(1);
    }
    return 0;
}
