/* ccq version macros; same major version = ABI compatible (as libuv's uv/version.h).
 * CMakeLists.txt's project(VERSION) must agree: configuring fails if it does not. */
#ifndef CCQ_VERSION_H
#define CCQ_VERSION_H

#define CCQ_VERSION_MAJOR 0
#define CCQ_VERSION_MINOR 2
#define CCQ_VERSION_PATCH 0

#define CCQ_VERSION_HEX ((CCQ_VERSION_MAJOR << 16) | (CCQ_VERSION_MINOR << 8) | (CCQ_VERSION_PATCH))

#define CCQ_STRINGIFY_(x) #x
#define CCQ_STRINGIFY(x)  CCQ_STRINGIFY_(x)
#define CCQ_VERSION_STRING                                                                         \
    CCQ_STRINGIFY(CCQ_VERSION_MAJOR)                                                               \
    "." CCQ_STRINGIFY(CCQ_VERSION_MINOR) "." CCQ_STRINGIFY(CCQ_VERSION_PATCH)

#endif /* CCQ_VERSION_H */
