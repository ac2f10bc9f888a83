// The program around libprog_static_threads.so (prog_static_threads.cpp built with
// -DAS_LIBRARY), a DT_NEEDED library: the loader runs the constructors of a program's
// DT_NEEDED libraries before those of its LD_PRELOAD libraries, so the library's static
// threads are already calling munmap and madvise while libmrcache.so's constructor runs.
int library_main(void);

int main(void) { return library_main(); }
