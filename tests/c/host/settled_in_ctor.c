/* The first registration made in a library constructor, that is with the loader lock held
 * (libsettled_in_ctor.so, loaded by `arena_settled 1 LIB`): mrcache's drain thread must
 * get through its start-up without that lock. A std::thread blocked on it (a thread-local
 * destructor's registration) until dlopen returned, and the registration waited its 100 ms.
 * Here the constructor looks, after the registration, for the thread called mrcache-drain
 * in its drain sleep (clock_nanosleep, syscall 230); it leaves 1 in drain_sleeping if it
 * saw that within 10 s, 0 if not. */
#define _GNU_SOURCE
#include <dirent.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static struct ibv_mr the_mr;
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    return &the_mr;
}
static int fake_dereg(struct ibv_mr *mr) { return 0; }

static int read_line(const char *task, const char *what, char *out, int size) {
    char path[320];
    snprintf(path, sizeof path, "/proc/self/task/%s/%s", task, what);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int ok = fgets(out, size, f) != NULL;
    fclose(f);
    return ok;
}

static int drain_in_its_sleep(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        char comm[64], call[256];
        if (e->d_name[0] != '.' && read_line(e->d_name, "comm", comm, sizeof comm) &&
            strcmp(comm, "mrcache-drain\n") == 0 && read_line(e->d_name, "syscall", call, sizeof call))
            found = strncmp(call, "230 ", 4) == 0;
    }
    closedir(d);
    return found;
}

int drain_sleeping = -1;

__attribute__((constructor)) static void register_while_loading(void) {
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    static char buf[1 << 16];
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
        return;
    ibv_dereg_mr(mr);
    drain_sleeping = 0;
    for (int i = 0; i < 10000 && !drain_sleeping; i++) {
        drain_sleeping = drain_in_its_sleep();
        usleep(1000);
    }
}
