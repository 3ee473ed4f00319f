// platform/file.c and proc.c: atomic replacement (also when the write fails halfway),
// write-through to what a user named, capped reads of regular files only, maps, mkdir -p,
// directory publishing and tree removal, symlink following, dead pids.
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "platform/platform.h"

static void make_tmpdir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/l3d_pf_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void put(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s", path);
    fputs(text, fp);
    fclose(fp);
}

static void expect_content(const char *path, const char *want) {
    char *buf;
    size_t len;
    int rc = l3d_file_read_all(path, 0, &buf, &len);
    cr_assert_eq(rc, 0, "%s: %s", path, strerror(-rc));
    cr_assert_eq(len, strlen(want), "%s", path);
    cr_assert_str_eq(buf, want);
    free(buf);
}

// Entries of `dir` whose name contains `part`.
static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strstr(de->d_name, part)) n++;
    closedir(d);
    return n;
}

Test(file, write_atomic_replaces_wholly) {
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/f.txt", dir);
    l3d_iovec_t p1[3] = {{"hello ", 6}, {NULL, 0}, {"world, long first version", 25}};
    cr_assert_eq(l3d_file_write_atomic(path, p1, 3), 0);
    expect_content(path, "hello world, long first version");
    l3d_iovec_t p2[1] = {{"short", 5}};
    cr_assert_eq(l3d_file_write_atomic(path, p2, 1), 0);
    expect_content(path, "short");  // no tail of the longer old version
    cr_assert_eq(l3d_file_write_atomic(path, NULL, 0), 0);
    expect_content(path, "");
    cr_assert_eq(count_entries(dir, ""), 1, "temp files left behind");

    // A large multi-piece write (several MiB) comes back byte for byte.
    size_t n = 5u << 20;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (char)(i * 131 + (i >> 13));
    l3d_iovec_t p3[2] = {{big, n / 3}, {big + n / 3, n - n / 3}};
    cr_assert_eq(l3d_file_write_atomic(path, p3, 2), 0);
    char *back;
    size_t blen;
    cr_assert_eq(l3d_file_read_all(path, 0, &back, &blen), 0);
    cr_assert_eq(blen, n);
    cr_assert_eq(memcmp(back, big, n), 0);
    free(back);
    free(big);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

// The write fails halfway (the file-size limit): old file intact, no temp file.
Test(file, write_atomic_failure_midway_keeps_old) {
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/f.txt", dir);
    put(path, "old content");
    signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 4096;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    size_t n = 1 << 20;
    char *big = calloc(1, n);
    l3d_iovec_t p[2] = {{"head", 4}, {big, n}};
    int rc = l3d_file_write_atomic(path, p, 2);
    setrlimit(RLIMIT_FSIZE, &old);
    cr_assert_eq(rc, -EFBIG, "rc %d (%s)", rc, strerror(-rc));
    expect_content(path, "old content");
    cr_assert_eq(count_entries(dir, ".tmp."), 0, "temp file left behind");
    free(big);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

Test(file, write_atomic_unwritable_dir_keeps_old) {
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/f.txt", dir);
    put(path, "old content");
    // Root ignores directory permissions: become "nobody" (this test runs in its own process).
    if (geteuid() == 0) {
        if (chown(dir, 65534, 65534) != 0 || chown(path, 65534, 65534) != 0 ||
            setgid(65534) != 0 || setuid(65534) != 0)
            cr_skip_test("cannot drop root privileges");
    }
    cr_assert_eq(chmod(dir, 0555), 0);
    l3d_iovec_t p[1] = {{"new", 3}};
    int rc = l3d_file_write_atomic(path, p, 1);
    chmod(dir, 0755);
    cr_assert_eq(rc, -EACCES, "rc %d", rc);
    expect_content(path, "old content");
    cr_assert_eq(count_entries(dir, ".tmp."), 0);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

// The rename fails (the target is a non-empty directory): nothing changes, no temp file.
Test(file, write_atomic_rename_failure) {
    char dir[64], path[128], inner[160];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/target", dir);
    snprintf(inner, sizeof(inner), "%s/keep", path);
    cr_assert_eq(l3d_dir_create(path), 0);
    put(inner, "kept");
    l3d_iovec_t p[1] = {{"new", 3}};
    int rc = l3d_file_write_atomic(path, p, 1);
    cr_assert(rc < 0);
    cr_assert(l3d_path_is_dir(path));
    expect_content(inner, "kept");
    cr_assert_eq(count_entries(dir, ".tmp."), 0);
    // The temp name taken by a directory: open fails, the old file stays.
    char file[128], tmp[200];
    snprintf(file, sizeof(file), "%s/g.txt", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", file, (long)getpid());
    put(file, "old");
    cr_assert_eq(mkdir(tmp, 0755), 0);
    cr_assert(l3d_file_write_atomic(file, p, 1) < 0);
    expect_content(file, "old");
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

Test(file, read_all_cap_and_errors) {
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/f.txt", dir);
    char text[101];
    memset(text, 'x', 100);
    text[100] = '\0';
    put(path, text);
    char *buf = (char *)1;
    size_t len = 7;
    cr_assert_eq(l3d_file_read_all(path, 99, &buf, &len), -EFBIG);
    cr_assert_null(buf);
    cr_assert_eq(l3d_file_read_all(path, 100, &buf, &len), 0);
    cr_assert_eq(len, 100);
    cr_assert_eq(buf[100], '\0');
    free(buf);
    cr_assert_eq(l3d_file_read_all(path, 0, &buf, NULL), 0);
    free(buf);
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/none", dir);
    cr_assert_eq(l3d_file_read_all(missing, 0, &buf, &len), -ENOENT);
    cr_assert_eq(l3d_file_read_all(dir, 0, &buf, &len), -EISDIR);
    // /proc files report size 0 but have content: the buffer must grow.
    cr_assert_eq(l3d_file_read_all("/proc/self/status", 0, &buf, &len), 0);
    cr_assert(len > 0 && strstr(buf, "Name:"));
    cr_assert_eq(strlen(buf), len);
    free(buf);
    cr_assert_eq(l3d_file_read_all("/proc/self/status", 10, &buf, &len), -EFBIG);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

Test(file, map) {
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/f.bin", dir);
    put(path, "mapped bytes");
    const void *data;
    size_t len;
    cr_assert_eq(l3d_file_map(path, &data, &len), 0);
    cr_assert_eq(len, 12);
    cr_assert_eq(memcmp(data, "mapped bytes", 12), 0);
    l3d_file_unmap(data, len);
    put(path, "");
    cr_assert_eq(l3d_file_map(path, &data, &len), 0);
    cr_assert_null(data);
    cr_assert_eq(len, 0);
    l3d_file_unmap(data, len);
    cr_assert_eq(l3d_file_map(dir, &data, &len), -EISDIR);
    snprintf(path, sizeof(path), "%s/none", dir);
    cr_assert_eq(l3d_file_map(path, &data, &len), -ENOENT);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

Test(file, dir_create_and_queries) {
    char dir[64], p[200];
    make_tmpdir(dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/a//b/c/", dir);
    cr_assert_eq(l3d_dir_create(p), 0);
    cr_assert_eq(l3d_dir_create(p), 0);  // existing is fine
    snprintf(p, sizeof(p), "%s/a/b/c", dir);
    cr_assert(l3d_path_is_dir(p));
    cr_assert(l3d_path_exists(p));
    snprintf(p, sizeof(p), "%s/a/file", dir);
    put(p, "x");
    cr_assert(l3d_path_exists(p));
    cr_assert(!l3d_path_is_dir(p));
    cr_assert_eq(l3d_dir_create(p), -ENOTDIR);
    snprintf(p, sizeof(p), "%s/a/file/sub", dir);
    cr_assert_eq(l3d_dir_create(p), -ENOTDIR);
    cr_assert(!l3d_path_exists(p));
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    cr_assert(!l3d_path_exists(dir));
}

Test(file, dir_replace) {
    char dir[64], src[128], dst[128], p[200];
    make_tmpdir(dir, sizeof(dir));
    snprintf(src, sizeof(src), "%s/ckpt.new", dir);
    snprintf(dst, sizeof(dst), "%s/ckpt", dir);
    // No dst yet: src just moves.
    snprintf(p, sizeof(p), "%s/x", src);
    cr_assert_eq(l3d_dir_create(src), 0);
    put(p, "v1");
    cr_assert_eq(l3d_dir_replace(src, dst), 0);
    cr_assert(!l3d_path_exists(src));
    snprintf(p, sizeof(p), "%s/x", dst);
    expect_content(p, "v1");
    // dst exists (with a sub-directory): replaced by the new version as a whole.
    snprintf(p, sizeof(p), "%s/old_only/deep", dst);
    cr_assert_eq(l3d_dir_create(p), 0);
    snprintf(p, sizeof(p), "%s/x", src);
    cr_assert_eq(l3d_dir_create(src), 0);
    put(p, "v2");
    snprintf(p, sizeof(p), "%s/y", src);
    put(p, "new file");
    snprintf(p, sizeof(p), "%s/", dst);  // a trailing slash names the same directory
    cr_assert_eq(l3d_dir_replace(src, p), 0);
    cr_assert(!l3d_path_exists(src));
    snprintf(p, sizeof(p), "%s/x", dst);
    expect_content(p, "v2");
    snprintf(p, sizeof(p), "%s/y", dst);
    expect_content(p, "new file");
    snprintf(p, sizeof(p), "%s/old_only", dst);
    cr_assert(!l3d_path_exists(p), "old tree leaked into the new one");
    cr_assert_eq(count_entries(dir, ""), 1, "the old version was not removed");
    // Missing src: an error, dst untouched.
    cr_assert_eq(l3d_dir_replace(src, dst), -ENOENT);
    snprintf(p, sizeof(p), "%s/x", dst);
    expect_content(p, "v2");
    // src a file: refused.
    snprintf(p, sizeof(p), "%s/plain", dir);
    put(p, "f");
    cr_assert_eq(l3d_dir_replace(p, dst), -ENOTDIR);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

Test(file, remove_tree) {
    char dir[64], root[128], p[256], outside[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/tree", dir);
    snprintf(outside, sizeof(outside), "%s/outside.txt", dir);
    put(outside, "precious");
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/d%d/e/f", root, i);
        cr_assert_eq(l3d_dir_create(p), 0);
        snprintf(p, sizeof(p), "%s/d%d/e/file", root, i);
        put(p, "x");
    }
    // A symlink to a file outside and one to the directory holding it: removed, not followed.
    snprintf(p, sizeof(p), "%s/link", root);
    cr_assert_eq(symlink(outside, p), 0);
    snprintf(p, sizeof(p), "%s/d0/dirlink", root);
    cr_assert_eq(symlink(dir, p), 0);
    cr_assert_eq(l3d_dir_remove_tree(root), 0);
    cr_assert(!l3d_path_exists(root));
    expect_content(outside, "precious");
    cr_assert_eq(l3d_dir_remove_tree(root), 0);  // missing is fine
    cr_assert_eq(l3d_dir_remove_tree(outside), 0);  // a plain file is removed too
    cr_assert(!l3d_path_exists(outside));
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

// What a user names is read only when it is a regular file, and never blocks: a FIFO
// without a writer, a directory and a device are refused at once.
Test(file, read_refuses_non_regular, .timeout = 30) {
    char dir[64], fifo[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    char *buf = NULL;
    size_t len;
    cr_assert_eq(l3d_file_read_all(fifo, 0, &buf, &len), -EINVAL);
    cr_assert_null(buf);
    const void *data;
    cr_assert_eq(l3d_file_map(fifo, &data, &len), -EINVAL);
    cr_assert_str_eq(l3d_path_kind(fifo), "a FIFO (named pipe)");
    cr_assert_eq(l3d_file_read_all("/dev/null", 0, &buf, &len), -EINVAL);
    cr_assert_str_eq(l3d_path_kind("/dev/null"), "a character device");
    cr_assert_str_eq(l3d_path_kind(dir), "a directory");
    uint64_t size = 0;
    snprintf(fifo, sizeof(fifo), "%s/f", dir);
    put(fifo, "12345");
    cr_assert_eq(l3d_path_size(fifo, &size), 0);
    cr_assert_eq(size, 5);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

static void *drain(void *arg) {  // reads a FIFO to EOF, returns the byte count
    FILE *f = fopen(arg, "rb");
    size_t n = 0;
    char b[256];
    for (size_t k; f && (k = fread(b, 1, sizeof(b), f)) > 0;) n += k;
    if (f) fclose(f);
    return (void *)n;
}

// --out: regular files atomically; symlinks, devices and FIFOs written through, never
// replaced; a full device is -ENOSPC.
Test(file, write_through, .timeout = 30) {
    char dir[64], p[128], link[128];
    make_tmpdir(dir, sizeof(dir));
    l3d_iovec_t io = {"payload", 7};
    snprintf(p, sizeof(p), "%s/target", dir);
    put(p, "old, longer content");
    snprintf(link, sizeof(link), "%s/link", dir);
    cr_assert_eq(symlink("target", link), 0);
    cr_assert_eq(l3d_file_write(link, &io, 1), 0);
    struct stat st;
    cr_assert(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the symlink was replaced");
    expect_content(p, "payload");
    cr_assert_eq(unlink(link), 0);
    cr_assert_eq(symlink("/dev/full", link), 0);
    cr_assert_eq(l3d_file_write(link, &io, 1), -ENOSPC);
    cr_assert_eq(l3d_file_write("/dev/null", &io, 1), 0);
    cr_assert(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    snprintf(p, sizeof(p), "%s/fifo", dir);
    cr_assert_eq(mkfifo(p, 0600), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, drain, p), 0);
    cr_assert_eq(l3d_file_write(p, &io, 1), 0);
    void *got;
    pthread_join(th, &got);
    cr_assert_eq((size_t)got, 7);
    cr_assert(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    cr_assert_eq(l3d_file_write(dir, &io, 1), -EISDIR);
    cr_assert_eq(l3d_file_write("", &io, 1), -ENOENT);
    snprintf(p, sizeof(p), "%s/new", dir);
    cr_assert_eq(l3d_file_write(p, &io, 1), 0);
    expect_content(p, "payload");
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

// Symlinks in the last component are followed, relative to the link's directory; a missing
// path (or a dangling link's target) comes back for the caller to create.
Test(file, path_follow) {
    char dir[64], p[128], out[256], want[256];
    make_tmpdir(dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/real", dir);
    cr_assert_eq(l3d_dir_create(p), 0);
    snprintf(p, sizeof(p), "%s/a", dir);
    cr_assert_eq(symlink("real", p), 0);
    snprintf(p, sizeof(p), "%s/b", dir);
    cr_assert_eq(symlink("a", p), 0);  // a chain
    snprintf(p, sizeof(p), "%s/b//", dir);
    cr_assert_eq(l3d_path_follow(p, out, sizeof(out)), 0);
    snprintf(want, sizeof(want), "%s/real", dir);
    cr_assert_str_eq(out, want);
    snprintf(p, sizeof(p), "%s/dangling", dir);
    cr_assert_eq(symlink("/nonexistent/x", p), 0);
    cr_assert_eq(l3d_path_follow(p, out, sizeof(out)), 0);
    cr_assert_str_eq(out, "/nonexistent/x");
    snprintf(p, sizeof(p), "%s/missing/", dir);
    cr_assert_eq(l3d_path_follow(p, out, sizeof(out)), 0);
    snprintf(want, sizeof(want), "%s/missing", dir);
    cr_assert_str_eq(out, want);
    snprintf(p, sizeof(p), "%s/loop", dir);
    cr_assert_eq(symlink("loop", p), 0);
    cr_assert_eq(l3d_path_follow(p, out, sizeof(out)), -ELOOP);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
}

Test(proc, dead_and_host) {
    pid_t child = fork();
    if (child == 0) _exit(0);
    cr_assert(child > 0);
    cr_assert_eq(waitpid(child, NULL, 0), child);
    cr_assert(l3d_proc_is_dead(child));
    cr_assert(!l3d_proc_is_dead(getpid()));
    cr_assert(!l3d_proc_is_dead(1));   // init: alive (or not ours to signal)
    cr_assert(!l3d_proc_is_dead(-5));  // nonsense is never "dead"
    char a[200], b[200];
    if (l3d_host_id(a, sizeof(a)) == 0) {
        cr_assert_eq(l3d_host_id(b, sizeof(b)), 0);
        cr_assert_str_eq(a, b);
        cr_assert(strstr(a, "pid:["), "%s", a);
    }
}

Test(time, monotonic) {
    double a = l3d_time_now(), b = l3d_time_now();
    cr_assert(a > 0.0);
    cr_assert(b >= a);
}
