/* Behind libmrcache.so in LD_PRELOAD for tests/c/host/admit_cost.c: libibverbs' reg/dereg
 * (verbs_shim.c, counting what is passed through) and the calls MRCACHE_REMOTE=revoke makes
 * to set up its QP (w6_shim.c), over the program's fake provider. */
#include "verbs_shim.c"
#include "w6_shim.c"
