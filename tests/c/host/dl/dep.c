char dep_buf[16 * 4096] __attribute__((aligned(4096)));
