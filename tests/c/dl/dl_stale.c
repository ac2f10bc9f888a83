#include "../stale.c"
