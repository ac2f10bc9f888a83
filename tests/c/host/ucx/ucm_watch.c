/* UCX's memory hooks in a test process (libucm): ucm_watch_install() asks UCM for
 * VM_UNMAPPED events, which installs its mmap hooks in the mode UCX_MEM_MMAP_HOOK_MODE
 * names (bistro: jumps written over libc's entry points; reloc: GOT entries). With
 * UCM_WATCH_EARLY=1 it does so from this library's constructor, which runs before
 * libmrcache.so's (a dependency of the program, loaded after the preload), so UCX's jumps
 * are in libc before mrcache patches it; otherwise the program calls it from main, after. */
#include <stdio.h>
#include <stdlib.h>
#include <ucm/api/ucm.h>

char *ucm_watch_lo, *ucm_watch_hi;
int ucm_watch_events;

static void on_unmap(ucm_event_type_t type, ucm_event_t *ev, void *arg) {
    (void)type, (void)arg;
    char *a = ev->vm_unmapped.address;
    if (a < ucm_watch_hi && a + ev->vm_unmapped.size > ucm_watch_lo)
        ucm_watch_events++;
}

int ucm_watch_install(void) {
    return ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, on_unmap, NULL) == UCS_OK ? 0 : -1;
}

__attribute__((constructor)) static void early(void) {
    const char *e = getenv("UCM_WATCH_EARLY");
    if (e && *e == '1' && ucm_watch_install() != 0) {
        fprintf(stderr, "FAIL: UCM could not install its memory hooks (constructor)\n");
        exit(4);
    }
}
