/* A plugin with a static (bss) buffer, for tests/c/guest/dlclose.c: built as $BIN/libdlplugin.so. */
char plugin_buffer[1 << 20] __attribute__((aligned(4096)));
