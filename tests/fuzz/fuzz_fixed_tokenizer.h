// The small fixed tokenizer the fuzz targets share: the 256 bytes in tiktoken's format,
// merges "ab", "abc", " a", and Llama 3's special tokens after them (BOS 259; the reader adds
// them to a tiktoken file, so it knows Llama 3's chat template too).
#ifndef L3D_FUZZ_FIXED_TOKENIZER_H
#define L3D_FUZZ_FIXED_TOKENIZER_H

#include <stdio.h>

// Writes it as a tokenizer.model at path: 0, or -1 where the file could not be written.
static inline int fuzz_fixed_tokenizer_write(const char *path) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (int c = 0; c < 256; c++) fprintf(f, "%c%c== %d\n", b64[c >> 2], b64[(c & 3) << 4], c);
    fprintf(f, "YWI= 256\nYWJj 257\nIGE= 258\n");
    return fclose(f) ? -1 : 0;
}

#endif
