// Reading the files a user names (core/input.h): the platform's read and map, with its errors
// turned into one line that says what is wrong with the file.
// defines: l3d_input_read, l3d_input_map, l3d_input_json, l3d_input_parse, l3d_input_error,
//          l3d_input_dir
#include "core/input.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/l3d_core.h"
#include "platform/platform.h"

l3d_status l3d_input_error(l3d_ctx_t *ctx, const char *path, const char *what, int rc,
                           size_t max_len) {
    const char *w = what ? what : "", *sp = what ? " " : "";
    switch (rc) {
    case -ENOMEM:
        return l3d_error(ctx, L3D_ERR_NOMEM, "cannot read %s%s%s: out of memory", w, sp, path);
    case -EIO:
        return l3d_error(ctx, L3D_ERR_IO, "cannot read %s%s%s: %s", w, sp, path, strerror(-rc));
    case -EFBIG: {
        uint64_t size = 0;
        l3d_path_size(path, &size);
        return l3d_error(ctx, L3D_ERR_CONFIG, "cannot read %s%s%s: it is %.1f MiB; the limit "
                         "for this file is %zu MiB", w, sp, path, (double)size / (1 << 20),
                         max_len >> 20);
    }
    case -ENOENT:
    case -ELOOP:
    case -EISDIR:
    case -EINVAL:  // the platform's word for a FIFO or device it would not open
    case -ENXIO:   // open() of a socket
    case -ENODEV: {
        // The file is what the user gave, and what it is says what to fix.
        const char *kind = l3d_path_kind(path);
        if (!strcmp(kind, "missing"))
            return l3d_error(ctx, L3D_ERR_NOT_FOUND, "cannot read %s%s%s: it does not exist", w,
                             sp, path);
        if (!strcmp(kind, "a dangling symlink"))
            return l3d_error(ctx, L3D_ERR_NOT_FOUND, "cannot read %s%s%s: it is %s", w, sp,
                             path, kind);
        if (!strcmp(kind, "a symlink loop"))
            return l3d_error(ctx, L3D_ERR_CONFIG, "cannot read %s%s%s: it is %s", w, sp, path,
                             kind);
        if (strcmp(kind, "a regular file") && strcmp(kind, "unreadable"))
            return l3d_error(ctx, L3D_ERR_CONFIG, "cannot read %s%s%s: it is %s, not a regular "
                             "file", w, sp, path, kind);
        break;  // it changed under us: say what open said
    }
    default:
        break;
    }
    // Permission denied, a path through a file, a name too long: bad input all the same.
    return l3d_error(ctx, L3D_ERR_CONFIG, "cannot read %s%s%s: %s", w, sp, path, strerror(-rc));
}

l3d_status l3d_input_dir(l3d_ctx_t *ctx, const char *path, const char *what) {
    const char *kind = l3d_path_kind(path);
    if (!strcmp(kind, "a directory")) return L3D_OK;
    if (!strcmp(kind, "missing"))
        return l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s %s: it does not exist", what, path);
    if (!strcmp(kind, "a dangling symlink"))
        return l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s %s: it is %s", what, path, kind);
    if (!strcmp(kind, "a symlink loop") || !strcmp(kind, "unreadable"))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s %s: it is %s", what, path, kind);
    return l3d_error(ctx, L3D_ERR_CONFIG, "%s %s: it is %s, not a directory", what, path, kind);
}

l3d_status l3d_input_read(l3d_ctx_t *ctx, const char *path, const char *what, size_t max_len,
                          char **buf_p, size_t *len_p) {
    int rc = l3d_file_read_all(path, max_len, buf_p, len_p);
    return rc ? l3d_input_error(ctx, path, what, rc, max_len) : L3D_OK;
}

l3d_status l3d_input_map(l3d_ctx_t *ctx, const char *path, const char *what,
                         const void **data_p, size_t *len_p) {
    int rc = l3d_file_map(path, data_p, len_p);
    return rc ? l3d_input_error(ctx, path, what, rc, 0) : L3D_OK;
}

l3d_status l3d_input_parse(l3d_ctx_t *ctx, const char *path, const char *what, const char *text,
                           size_t len, size_t flags, json_t **root_p) {
    json_error_t err;
    *root_p = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &err);
    if (*root_p) return L3D_OK;
    return l3d_error(ctx, L3D_ERR_FORMAT, "%s%s%s: line %d column %d: invalid JSON: %s",
                     what ? what : "", what ? " " : "", path, err.line, err.column, err.text);
}

l3d_status l3d_input_json(l3d_ctx_t *ctx, const char *path, const char *what, size_t flags,
                          json_t **root_p) {
    char *text = NULL;
    size_t len = 0;
    *root_p = NULL;
    L3D_CHECK(ctx, l3d_input_read(ctx, path, what, L3D_INPUT_JSON_MAX, &text, &len));
    l3d_status st = l3d_input_parse(ctx, path, what, text, len, flags, root_p);
    free(text);
    return st;
}
