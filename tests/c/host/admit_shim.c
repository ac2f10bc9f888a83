/* Behind libmrcache.so in LD_PRELOAD for tests/c/host/admit_cost.c: libibverbs' reg/dereg
 * (verbs_shim.c, counting what is passed through) and the calls MRCACHE_REMOTE=revoke makes
 * to set up its QP (window_shim.c), over the program's fake provider. */
#include "verbs_shim.c"
#include "window_shim.c"
