/* The module loader (see module.h). Built twice: for libccq.so it opens module files with
 * dlopen; for libccq.a (CCQ_MODULES_BUILTIN) it hands out the modules linked in, listed by
 * the build in ccq_builtin_modules.h, and never calls dlopen. */
#define _GNU_SOURCE /* dladdr */
#include "backends/module.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CCQ_MODULES_BUILTIN

/* The build writes one CCQ_BUILTIN_MODULE(name) line per module it built. */
#define CCQ_BUILTIN_MODULE(n) extern const ccq_module ccq_module_##n;
#include "ccq_builtin_modules.h"
#undef CCQ_BUILTIN_MODULE

static const ccq_module *const builtin[] = {
#define CCQ_BUILTIN_MODULE(n) &ccq_module_##n,
#include "ccq_builtin_modules.h"
#undef CCQ_BUILTIN_MODULE
    NULL,
};

ccq_status ccq_module_get(const char *name, const char *needed_by, const ccq_module **out,
                          ccq_errbuf *err)
{
    for (size_t i = 0; builtin[i] != NULL; i++) {
        if (strcmp(builtin[i]->name, name) == 0) {
            *out = builtin[i];
            return CCQ_OK;
        }
    }
    *out = NULL;
    snprintf(err->msg, sizeof err->msg,
             "%s needs ccq's %s module, which this static libccq (libccq.a) was built without "
             "(CMake builds a module where it finds what it needs; see README.md, Modules)",
             needed_by, name);
    return CCQ_ERR_UNSUPPORTED;
}

#else /* libccq.so */

#include <dlfcn.h>

#define MODULE_FILE_FMT "libccq-%s.so." CCQ_STRINGIFY(CCQ_VERSION_MAJOR)
#define MODULES_MAX     16u

/* Modules loaded so far: each is loaded once and kept for the life of the process (a module's
 * library may register exit handlers, as MPI does, and its tables are referenced by live
 * runtimes). Only the first call for a module takes long; later ones are a lookup. */
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static const ccq_module *modules[MODULES_MAX];
static unsigned nmodules;

/* What the detail says about the paths tried, appended as they are tried. */
typedef struct tried {
    char text[CCQ_DETAIL_LEN];
    size_t len;
    unsigned n;
} tried;

static void tried_add(tried *t, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tried_add(tried *t, const char *path, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->len >= sizeof t->text - 1)
        return;
    n = snprintf(t->text + t->len, sizeof t->text - t->len, "%s%s (", t->n++ ? "; " : "", path);
    if (n > 0)
        t->len += (size_t)n < sizeof t->text - t->len ? (size_t)n : sizeof t->text - t->len - 1;
    va_start(ap, fmt);
    n = vsnprintf(t->text + t->len, sizeof t->text - t->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n < sizeof t->text - t->len ? (size_t)n : sizeof t->text - t->len - 1;
    n = snprintf(t->text + t->len, sizeof t->text - t->len, ")");
    if (n > 0)
        t->len += (size_t)n < sizeof t->text - t->len ? (size_t)n : sizeof t->text - t->len - 1;
}

/* dlerror() without the "PATH: " it starts with when it is about the file itself. */
static const char *load_error(const char *path)
{
    const char *e = dlerror();
    size_t n = strlen(path);

    if (e == NULL)
        return "unknown error";
    if (strncmp(e, path, n) == 0 && e[n] == ':' && e[n + 1] == ' ')
        return e + n + 2;
    return e;
}

/* Open dir/file and check its entry. NULL (with the reason added to t) when it does not load
 * or is not a module of this libccq. */
static const ccq_module *try_dir(const char *dir, size_t dirlen, const char *file, const char *name,
                                 tried *t)
{
    char path[4096], symbol[64];
    const ccq_module *m;
    void *h;

    if (dirlen == 0)
        return NULL;
    if ((size_t)snprintf(path, sizeof path, "%.*s/%s", (int)dirlen, dir, file) >= sizeof path)
        return NULL;
    snprintf(symbol, sizeof symbol, CCQ_MODULE_SYMBOL_PREFIX "%s", name);
    /* RTLD_NOW: a symbol the module or its libraries lack fails here, with its name, instead
     * of at some later call. RTLD_LOCAL: nothing of a vendor library joins the global scope. */
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        tried_add(t, path, "%s", load_error(path));
        return NULL;
    }
    (void)dlerror();
    m = dlsym(h, symbol);
    if (m == NULL) {
        tried_add(t, path, "not a ccq module: %s", load_error(path));
    } else if (m->abi != CCQ_MODULE_ABI) {
        tried_add(t, path,
                  "built for module ABI %u, this libccq needs %u: rebuild it with this ccq", m->abi,
                  CCQ_MODULE_ABI);
    } else if (m->version != CCQ_VERSION_HEX) {
        tried_add(t, path, "built with ccq %u.%u.%u, this libccq is " CCQ_VERSION_STRING,
                  m->version >> 16, (m->version >> 8) & 0xffu, m->version & 0xffu);
    } else if (m->name == NULL || strcmp(m->name, name) != 0) {
        tried_add(t, path, "its entry names module \"%s\"", m->name ? m->name : "(null)");
    } else {
        return m; /* h stays open for the life of the process */
    }
    dlclose(h);
    return NULL;
}

static const ccq_module *load(const char *name, tried *t)
{
    char file[64];
    const char *paths = getenv("CCQ_MODULE_PATH");
    const ccq_module *m = NULL;
    Dl_info self;

    snprintf(file, sizeof file, MODULE_FILE_FMT, name);
    /* The directory libccq.so was loaded from: where its packages and `make install` put the
     * modules. */
    if (dladdr((const void *)&ccq_module_get, &self) != 0 && self.dli_fname != NULL) {
        const char *slash = strrchr(self.dli_fname, '/');
        if (slash != NULL)
            m = try_dir(self.dli_fname, (size_t)(slash - self.dli_fname), file, name, t);
    }
    for (const char *p = paths; m == NULL && p != NULL && *p != '\0';) {
        const char *end = strchr(p, ':');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        m = try_dir(p, len, file, name, t);
        p = end != NULL ? end + 1 : NULL;
    }
    return m;
}

ccq_status ccq_module_get(const char *name, const char *needed_by, const ccq_module **out,
                          ccq_errbuf *err)
{
    const char *paths;
    tried t = {.len = 0, .n = 0};
    char file[64];
    size_t n;

    *out = NULL;
    t.text[0] = '\0';
    pthread_mutex_lock(&modules_lock);
    for (unsigned i = 0; i < nmodules; i++) {
        if (strcmp(modules[i]->name, name) == 0) {
            *out = modules[i];
            break;
        }
    }
    if (*out == NULL && nmodules < MODULES_MAX) {
        *out = load(name, &t);
        if (*out != NULL)
            modules[nmodules++] = *out;
    }
    pthread_mutex_unlock(&modules_lock);
    if (*out != NULL)
        return CCQ_OK;
    snprintf(file, sizeof file, MODULE_FILE_FMT, name);
    paths = getenv("CCQ_MODULE_PATH");
    n = (size_t)snprintf(err->msg, sizeof err->msg,
                         "%s needs %s, which could not be loaded (install it beside libccq.so, or "
                         "set CCQ_MODULE_PATH to its directory%s): tried ",
                         needed_by, file, paths == NULL || *paths == '\0' ? ", unset now" : "");
    /* As much of the list as fits; the first paths (libccq's own directory) come first. */
    if (n < sizeof err->msg - 1) {
        const char *list = t.n ? t.text : "nothing";
        size_t k = strlen(list);
        if (k > sizeof err->msg - 1 - n)
            k = sizeof err->msg - 1 - n;
        memcpy(err->msg + n, list, k);
        err->msg[n + k] = '\0';
    }
    return CCQ_ERR_UNSUPPORTED;
}

#endif /* CCQ_MODULES_BUILTIN */
