extern char dep_buf[];
char *plug_buf(void) { return dep_buf; }
