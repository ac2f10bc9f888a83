#include "../reg_loop.c"
