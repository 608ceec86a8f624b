#!/bin/sh
# bindings/rust/README.md's "CCQ_LIB_DIR=../../build cargo test", run as written: from
# bindings/rust, with the library directory given relative to it (the README's ../../build
# is this build directory when that is the repository's build/; another build directory is
# put in its place, still relative). It failed with exit 127 while build.rs passed the
# relative path on as a relative rpath.
# Usage: rust_readme.sh <source dir> <build dir> <cargo>
set -eu
src=$1
build=$2
cargo=$3
readme=$src/bindings/rust/README.md
line=$(grep -m1 '^CCQ_LIB_DIR=\.\./\.\./build cargo test' "$readme" | sed 's/[[:space:]]*#.*//')
[ -n "$line" ] || { echo "no 'CCQ_LIB_DIR=../../build cargo test' line in $readme" >&2; exit 1; }
cd "$src/bindings/rust"
rel=$(realpath --relative-to=. "$build")
line=$(printf '%s\n' "$line" | sed "s|CCQ_LIB_DIR=\.\./\.\./build |CCQ_LIB_DIR=$rel |")
# The build's own target directory (not bindings/rust/target); offline, as .cargo/config.toml.
export CARGO_TARGET_DIR="$build/cargo" CARGO_NET_OFFLINE=true
export PATH="$(dirname "$cargo"):$PATH"
unset CCQ_INCLUDE_DIR CCQ_STATIC
echo "\$ cd bindings/rust && $line"
sh -c "$line -q"
