/* Runs LLVMFuzzerTestOneInput over files and directories without libFuzzer, so the regression
 * corpus (tests/fuzz/corpus) runs under any compiler as a ctest. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *data = NULL;
    size_t size = 0, cap = 0, got;

    if (fp == NULL) {
        perror(path);
        return -1;
    }
    do {
        if (size == cap) {
            uint8_t *n = realloc(data, cap = cap ? 2 * cap : 4096);
            if (n == NULL) {
                fprintf(stderr, "%s: out of memory\n", path);
                free(data);
                fclose(fp);
                return -1;
            }
            data = n;
        }
        got = fread(data + size, 1, cap - size, fp);
        size += got;
    } while (got > 0);
    if (ferror(fp)) {
        perror(path);
        free(data);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    /* Named first: a failing input aborts the process. */
    fprintf(stderr, "fuzz_replay: %s (%zu bytes)\n", path, size);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of a directory, in name order (not recursive). */
static int run_dir(const char *dir, unsigned *count)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (d == NULL) {
        perror(dir);
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        char *path;
        struct stat st;
        if (e->d_name[0] == '.')
            continue;
        path = malloc(strlen(dir) + strlen(e->d_name) + 2);
        if (path == NULL)
            break;
        sprintf(path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(path);
            continue;
        }
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            if (nn == NULL) {
                free(path);
                break;
            }
            names = nn;
        }
        names[n++] = path;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        if (run_file(names[i]) != 0)
            rc = -1;
        else
            (*count)++;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned count = 0;
    int rc = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            rc = 1;
        } else if (S_ISDIR(st.st_mode)) {
            if (run_dir(argv[i], &count) != 0)
                rc = 1;
        } else if (run_file(argv[i]) != 0) {
            rc = 1;
        } else {
            count++;
        }
    }
    fprintf(stderr, "fuzz_replay: %u inputs passed\n", count);
    if (count == 0) {
        fprintf(stderr, "fuzz_replay: no inputs found\n");
        rc = 1;
    }
    return rc;
}
