/* ccq version macros; same major version = ABI compatible (as libuv's uv/version.h).
 * CMakeLists.txt's project(VERSION) must agree: configuring fails if it does not. */
#ifndef CCQ_VERSION_H
#define CCQ_VERSION_H

/**
 * @file ccq/version.h
 * The version of the ccq headers a program is compiled with (included by ccq.h). Same major
 * version = ABI compatible; a newer minor version adds calls and appends fields. Compare with
 * the running library's ccq_version() / ccq_version_number().
 */

/** Major version: a different one is not ABI compatible. */
#define CCQ_VERSION_MAJOR 0
/** Minor version: calls and fields are added, never removed. */
#define CCQ_VERSION_MINOR 2
/** Patch version: fixes only. */
#define CCQ_VERSION_PATCH 0

/** The version as one number, (MAJOR << 16) | (MINOR << 8) | PATCH, as ccq_version_number()
 * returns it: `ccq_version_number() >= CCQ_VERSION_HEX` says the running library is at least
 * as new as this header. */
#define CCQ_VERSION_HEX ((CCQ_VERSION_MAJOR << 16) | (CCQ_VERSION_MINOR << 8) | (CCQ_VERSION_PATCH))

#define CCQ_STRINGIFY_(x) #x /* (CCQ_STRINGIFY's helper: expands x first) */
/** The text of a macro's value after expansion: CCQ_STRINGIFY(CCQ_VERSION_MAJOR) is "0". */
#define CCQ_STRINGIFY(x) CCQ_STRINGIFY_(x)
/** The version as text, "MAJOR.MINOR.PATCH" ("0.2.0"), as ccq_version() returns it. */
#define CCQ_VERSION_STRING                                                                         \
    CCQ_STRINGIFY(CCQ_VERSION_MAJOR)                                                               \
    "." CCQ_STRINGIFY(CCQ_VERSION_MINOR) "." CCQ_STRINGIFY(CCQ_VERSION_PATCH)

#endif /* CCQ_VERSION_H */
