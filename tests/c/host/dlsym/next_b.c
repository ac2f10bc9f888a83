/* Loaded after next_a: mrc_probe under the version MRC_1 (next_b.map). */
int mrc_probe(void) { return 'B'; }
