// Reading the files a user names, or that sit in a directory a user named: checkpoints (the
// index, shards, shards.json, trainer_state.json, config.json, generation_config.json),
// tokenizer files, chat files, configs. One opening path, so every reader refuses the same
// things with the same words and none of them blocks:
//   missing                                   L3D_ERR_NOT_FOUND  "... it does not exist"
//   a directory, FIFO, socket or device       L3D_ERR_CONFIG     "... it is a FIFO (named
//                                                                  pipe), not a regular file"
//   a symlink loop, a dangling symlink        L3D_ERR_CONFIG / NOT_FOUND, said as such
//   permission denied, bigger than the cap    L3D_ERR_CONFIG     the reason
// All of these exit 2 from the CLI; only a failing device (EIO) or memory is not bad input.
// Messages read "cannot read [<what> ]<path>: <reason>", `what` (may be NULL) saying which
// file it is ("model config", "--chat").
// defines: l3d_input_read, l3d_input_map, l3d_input_json, l3d_input_parse, l3d_input_error,
//          l3d_input_dir, L3D_INPUT_JSON_MAX
#ifndef L3D_INPUT_H
#define L3D_INPUT_H

#include <stddef.h>

#include <jansson.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

// The most a JSON file llama3d reads may hold: a real tokenizer.json is under 20 MiB, an
// index well under 1 MiB, so this bounds a wrong file without refusing a real one.
#define L3D_INPUT_JSON_MAX ((size_t)1 << 30)

// The error for platform result `rc` (-errno) on `path`; max_len is the cap that -EFBIG
// exceeded (0: none).
l3d_status l3d_input_error(l3d_ctx_t *ctx, const char *path, const char *what, int rc,
                           size_t max_len);

// The whole file, NUL-terminated, into a malloc'd *buf_p (release with free()); max_len caps
// its size (0: no cap).
l3d_status l3d_input_read(l3d_ctx_t *ctx, const char *path, const char *what, size_t max_len,
                          char **buf_p, size_t *len_p);

// The file mapped read-only (release with l3d_file_unmap); an empty file is NULL, 0.
l3d_status l3d_input_map(l3d_ctx_t *ctx, const char *path, const char *what,
                         const void **data_p, size_t *len_p);

// text[0..len), read from `path`, as JSON: duplicate keys rejected, jansson's `flags` added;
// a syntax error is L3D_ERR_FORMAT "[<what> ]<path>: line L column C: invalid JSON: <why>".
// Any JSON value; the caller checks its type. The caller json_decref()s *root_p.
l3d_status l3d_input_parse(l3d_ctx_t *ctx, const char *path, const char *what, const char *text,
                           size_t len, size_t flags, json_t **root_p);

// L3D_OK when `path` is a directory (a checkpoint a user named); otherwise L3D_ERR_NOT_FOUND
// "<what> <path>: it does not exist" (or is a dangling symlink) or L3D_ERR_CONFIG naming what
// it is instead ("it is a FIFO (named pipe), not a directory", "it is a symlink loop").
l3d_status l3d_input_dir(l3d_ctx_t *ctx, const char *path, const char *what);

// l3d_input_read (at most L3D_INPUT_JSON_MAX) then l3d_input_parse.
l3d_status l3d_input_json(l3d_ctx_t *ctx, const char *path, const char *what, size_t flags,
                          json_t **root_p);

#endif
