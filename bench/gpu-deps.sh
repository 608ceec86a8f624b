#!/usr/bin/env bash
# Collect the build dependencies a bare GPU machine may lack -- Concurrency Kit and cmocka
# (headers, shared libraries, relocatable .pc files) and pkg-config (pkgconf) -- from this
# machine's Debian packages into build-gpudeps/ (ignored by git), for bench/gpu-check.sh,
# which uses it only for what the GPU machine does not have itself.
# Usage (repo root, on a machine with libck-dev, libcmocka-dev and pkgconf installed):
#   bash bench/gpu-deps.sh [dir]        then carry build-gpudeps to the GPU machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${1:-$ROOT/build-gpudeps}
ARCH_LIB=/usr/lib/x86_64-linux-gnu

for p in libck-dev libck0 libcmocka-dev libcmocka0 pkgconf-bin libpkgconf3; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        echo "gpu-deps: Debian package $p is not installed here" >&2
        exit 1
    fi
done

rm -rf "$DEPS"
mkdir -p "$DEPS/include" "$DEPS/lib" "$DEPS/pkgconfig" "$DEPS/bin"

# Headers, keeping their layout under /usr/include (ck has gcc/<arch>/ subfolders).
for p in libck-dev libcmocka-dev; do
    dpkg -L "$p" | grep '^/usr/include/.' | while read -r f; do
        [ -f "$f" ] || continue
        rel=${f#/usr/include/}
        mkdir -p "$DEPS/include/$(dirname "$rel")"
        cp "$f" "$DEPS/include/$rel"
    done
done

# Shared libraries, as plain files under every name (links may not travel well).
for f in "$ARCH_LIB"/libck.so "$ARCH_LIB"/libck.so.0* "$ARCH_LIB"/libcmocka.so \
    "$ARCH_LIB"/libcmocka.so.0*; do
    cp -L "$f" "$DEPS/lib/$(basename "$f")"
done

# .pc files relative to their own folder, so the tree works wherever it lands.
ck_ver=$(dpkg-query -W -f='${Version}' libck-dev | sed 's/-.*//')
cmocka_ver=$(dpkg-query -W -f='${Version}' libcmocka-dev | sed 's/-.*//')
cat >"$DEPS/pkgconfig/ck.pc" <<EOF
prefix=\${pcfiledir}/..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: Concurrency Kit
Description: Concurrency primitives (carried for the GPU check)
Version: $ck_ver
Libs: -L\${libdir} -lck
Cflags: -D__x86_64__ -I\${includedir}
EOF
cat >"$DEPS/pkgconfig/cmocka.pc" <<EOF
prefix=\${pcfiledir}/..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: cmocka
Description: The cmocka unit testing library (carried for the GPU check)
Version: $cmocka_ver
Libs: -L\${libdir} -lcmocka
Cflags: -I\${includedir}
EOF

# pkg-config, for a machine without one: pkgconf and its library behind a wrapper.
cp -L /usr/bin/pkgconf "$DEPS/bin/pkgconf"
cp -L "$ARCH_LIB"/libpkgconf.so.3 "$DEPS/lib/libpkgconf.so.3"
cat >"$DEPS/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkgconf carried by bench/gpu-deps.sh; its library sits in ../lib.
d=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$d/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/pkgconf" "$@"
EOF
chmod +x "$DEPS/bin/pkg-config" "$DEPS/bin/pkgconf"

# Check the tree the way CMake will use it.
PKG_CONFIG_PATH="$DEPS/pkgconfig" "$DEPS/bin/pkg-config" --cflags --libs ck cmocka >/dev/null
echo "gpu-deps: $DEPS ready ($(du -sh "$DEPS" | cut -f1)): ck $ck_ver, cmocka $cmocka_ver, pkgconf"
