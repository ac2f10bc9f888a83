/* ucx_stale.c in a program linked with libucs, as ucx_perftest and MPICH's programs are:
 * libucm, a dependency of libucs, comes after libc in the search order, so UCX's bistro
 * finds no munmap with dlsym(RTLD_NEXT) from libucm and patches what dlsym(RTLD_DEFAULT)
 * gives it, which would be libmrcache.so's own hook. UCX's hooks are asked for through
 * the linked ucm_set_event_handler. */
#define UCX_LINKED
#include "ucx_stale.c"
