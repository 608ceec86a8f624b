/* The "file:DIR" bootstrap: a directory every process sees (local or a shared file system),
 * as Gloo's and PyTorch's FileStore. A missing DIR is created with its missing parents, mode
 * 0700 (a job's records are no other user's business). A record is one file, written under a
 * temporary name and renamed into place, so a reader sees all of it or nothing; readers poll
 * for it.
 *
 * Names: "ccq.<job>.<gen>.<tag>.r<rank>" with job and tag escaped to [A-Za-z0-9_-] plus
 * "%XX" (so '.' only separates fields; long ones become "h<hash>", the record itself holds
 * the full tag). Cleanup: at close each process adds "ccq.<job>.<gen>.~closed.r<rank>";
 * the process that sees all world_size markers removes every file of that job and
 * generation, so nobody deletes a record a slower process still has to read. A process's
 * first open (generation 0) also removes what an earlier job with the same id left under
 * its own rank (after a crash). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/boot/boot_impl.h"

#define NAME_FIELD_MAX 96 /* escaped job or tag longer than this is hashed */

typedef struct file_boot {
    char *dir;
    char prefix[160]; /* "ccq.<job>.<gen>." */
    char **written;   /* names this process published */
    size_t nwritten, cap;
    uint64_t tmp_seq;
} file_boot;

/* Escape s into out (NAME_FIELD_MAX + 1 bytes): [A-Za-z0-9_-] kept, others %XX, and a
 * result longer than NAME_FIELD_MAX replaced by "h" and the FNV-1a hash of s. */
static void escape_field(const char *s, char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t w = 0;

    for (const unsigned char *c = (const unsigned char *)s; *c != '\0'; c++) {
        bool keep = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                    (*c >= '0' && *c <= '9') || *c == '_' || *c == '-';
        if (w + (keep ? 1 : 3) > NAME_FIELD_MAX) {
            snprintf(out, NAME_FIELD_MAX + 1, "h%016llx",
                     (unsigned long long)ccq_boot_fnv1a(s, strlen(s), CCQ_FNV_OFFSET));
            return;
        }
        if (keep) {
            out[w++] = (char)*c;
        } else {
            out[w++] = '%';
            out[w++] = hex[*c >> 4];
            out[w++] = hex[*c & 15];
        }
    }
    out[w] = '\0';
}

static void record_name(const file_boot *f, const char *tag, uint32_t rank, char *out, size_t len)
{
    char t[NAME_FIELD_MAX + 1];
    escape_field(tag, t);
    snprintf(out, len, "%s%s.r%u", f->prefix, t, rank);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Write data under name atomically: a temporary file in the same directory, renamed. No
 * fsync: the other processes need to see the file, not to find it after a power cut
 * (NFS flushes at close, which close-to-open consistency relies on). */
static ccq_status write_atomic(ccq_boot *b, file_boot *f, const char *name, const void *data,
                               size_t len, ccq_errbuf *err)
{
    char tmp[4096], path[4096];
    const unsigned char *p = data;
    int fd;

    snprintf(tmp, sizeof tmp, "%s/.ccq.tmp.%ld.%016llx.%llu", f->dir, (long)getpid(),
             (unsigned long long)b->nonce, (unsigned long long)f->tmp_seq++);
    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        ccq_boot_err(err, "cannot create %s: %s", tmp, strerror(errno));
        return CCQ_ERR_BACKEND;
    }
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            ccq_boot_err(err, "cannot write %s: %s", tmp, k < 0 ? strerror(errno) : "no space");
            goto fail;
        }
        p += k;
        len -= (size_t)k;
    }
    if (close(fd) != 0) {
        fd = -1;
        ccq_boot_err(err, "cannot write %s: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        ccq_boot_err(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    return CCQ_OK;

fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return CCQ_ERR_BACKEND;
}

static ccq_status file_publish(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err)
{
    file_boot *f = b->impl;
    char name[320];
    ccq_status st;

    record_name(f, x->tag, b->rank, name, sizeof name);
    if (f->nwritten == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        char **w = realloc(f->written, cap * sizeof *w);
        if (w == NULL) {
            ccq_boot_err(err, "out of memory");
            return CCQ_ERR_NO_MEMORY;
        }
        f->written = w;
        f->cap = cap;
    }
    f->written[f->nwritten] = strdup(name);
    if (f->written[f->nwritten] == NULL) {
        ccq_boot_err(err, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    st = write_atomic(b, f, name, x->rec, x->rec_len, err);
    if (st != CCQ_OK) {
        free(f->written[f->nwritten]);
        return st;
    }
    f->nwritten++;
    return CCQ_OK;
}

/* Read the file `name` of the directory whole: CCQ_IN_PROGRESS while it does not exist. */
static ccq_status read_record(const file_boot *f, const char *name, size_t max, void **rec,
                              size_t *len, ccq_errbuf *err)
{
    char path[4096];
    struct stat sb;
    unsigned char *buf;
    size_t got = 0, size;
    int fd;

    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return CCQ_IN_PROGRESS;
        ccq_boot_err(err, "cannot open %s: %s", path, strerror(errno));
        return CCQ_ERR_BACKEND;
    }
    if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size > max) {
        ccq_boot_err(err, "%s: not a ccq record (size %lld)", path, (long long)sb.st_size);
        close(fd);
        return CCQ_ERR_BACKEND;
    }
    size = (size_t)sb.st_size;
    buf = malloc(size ? size : 1);
    if (buf == NULL) {
        close(fd);
        ccq_boot_err(err, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    while (got < size) {
        ssize_t k = read(fd, buf + got, size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    *rec = buf;
    *len = got; /* a short read shows up as a truncated record */
    return CCQ_OK;
}

static ccq_status file_fetch(ccq_boot *b, ccq_boot_xchg *x, uint32_t rank, void **rec, size_t *len,
                             ccq_errbuf *err)
{
    file_boot *f = b->impl;
    char name[320];

    record_name(f, x->tag, rank, name, sizeof name);
    return read_record(f, name, sizeof(ccq_boot_hdr) + CCQ_BOOT_TAG_MAX + CCQ_BOOT_VALUE_MAX, rec,
                       len, err);
}

/* Heartbeats: "ccq.<job>.<gen>.~hb.r<rank>", rewritten in place (a temporary file renamed
 * over it, so a reader sees one whole record), removed with the rest of the job's files by
 * the last process to close. '~' is never in an escaped tag, so no exchange can collide. */
static void beat_name(const file_boot *f, uint32_t rank, char *out, size_t len)
{
    snprintf(out, len, "%s~hb.r%u", f->prefix, rank);
}

static ccq_status file_beat_publish(ccq_boot *b, const void *rec, size_t len, ccq_errbuf *err)
{
    file_boot *f = b->impl;
    char name[200];

    beat_name(f, b->rank, name, sizeof name);
    return write_atomic(b, f, name, rec, len, err);
}

static ccq_status file_beat_fetch(ccq_boot *b, uint32_t rank, void **rec, size_t *len,
                                  ccq_errbuf *err)
{
    file_boot *f = b->impl;
    char name[200];

    beat_name(f, rank, name, sizeof name);
    return read_record(f, name, CCQ_BOOT_BEAT_MAX, rec, len, err);
}

/* Count the files named prefix...suffix (suffix NULL: any suffix), removing them when
 * remove is true. O(files in the directory): only open and close scan it. */
static size_t scan_dir(const file_boot *f, const char *prefix, const char *suffix, bool remove)
{
    DIR *d = opendir(f->dir);
    struct dirent *e;
    size_t n = 0, plen = strlen(prefix);
    char path[4096];

    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        if (suffix != NULL && !ends_with(e->d_name, suffix))
            continue;
        n++;
        if (remove) {
            snprintf(path, sizeof path, "%s/%s", f->dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    return n;
}

static void file_close(ccq_boot *b)
{
    file_boot *f = b->impl;
    char name[320], marker[200];
    ccq_errbuf ignored;

    snprintf(name, sizeof name, "%s~closed.r%u", f->prefix, b->rank);
    snprintf(marker, sizeof marker, "%s~closed.", f->prefix);
    /* The last one out removes everything of this job and generation. */
    if (write_atomic(b, f, name, "", 0, &ignored) == CCQ_OK &&
        scan_dir(f, marker, NULL, false) >= b->size)
        scan_dir(f, f->prefix, NULL, true);
    for (size_t i = 0; i < f->nwritten; i++)
        free(f->written[i]);
    free(f->written);
    free(f->dir);
    free(f);
}

static const ccq_boot_mech file_mech = {
    .name = "file",
    .poll_ns = 1000000, /* a stat-like open per missing member: 1 ms keeps an NFS server calm */
    .poll_max_ns = 250000000, /* ...and a long wait, a few opens a second (poll_gap) */
    .publish = file_publish,
    .fetch = file_fetch,
    .close = file_close,
    .beat_publish = file_beat_publish,
    .beat_fetch = file_beat_fetch,
};

/* Create dir and any missing parents, each 0700 (a job's records are nobody else's
 * business). The processes of a world race to do this: another one's mkdir winning is fine. */
static ccq_status make_dirs(const char *dir, ccq_errbuf *err)
{
    char *path = strdup(dir);

    if (path == NULL) {
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            ccq_boot_err(err,
                         "bootstrap file:%s: cannot create %s: %s (the directory must be seen "
                         "by every process of the world)",
                         dir, path, strerror(errno));
            free(path);
            return CCQ_ERR_INVALID_ARGUMENT;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    free(path);
    return CCQ_OK;
}

ccq_status ccq_boot_file_open(ccq_boot *b, const char *dir, ccq_errbuf *err)
{
    struct stat sb;
    file_boot *f;
    char job[NAME_FIELD_MAX + 1];

    if (*dir == '\0') {
        ccq_boot_err(err, "bootstrap \"file:\": no directory after \"file:\"");
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (stat(dir, &sb) != 0 && errno == ENOENT) {
        ccq_status st = make_dirs(dir, err);
        if (st != CCQ_OK)
            return st;
    }
    if (stat(dir, &sb) != 0) {
        ccq_boot_err(err,
                     "bootstrap file:%s: %s (the directory must be seen by every process of "
                     "the world)",
                     dir, strerror(errno));
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (!S_ISDIR(sb.st_mode)) {
        ccq_boot_err(err, "bootstrap file:%s: not a directory", dir);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        ccq_boot_err(err, "bootstrap file:%s: cannot write there: %s", dir, strerror(errno));
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    f = calloc(1, sizeof *f);
    if (f == NULL || (f->dir = strdup(dir)) == NULL) {
        free(f);
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    escape_field(b->job, job);
    snprintf(f->prefix, sizeof f->prefix, "ccq.%s.%u.", job, b->gen);
    if (b->gen == 0) {
        /* Leftovers of an earlier job with this id under this rank (every generation). */
        char any[160], mine[32];
        snprintf(any, sizeof any, "ccq.%s.", job);
        snprintf(mine, sizeof mine, ".r%u", b->rank);
        scan_dir(f, any, mine, true);
    }
    b->mech = &file_mech;
    b->impl = f;
    return CCQ_OK;
}
