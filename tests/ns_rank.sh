#!/bin/sh
# Run a world test's process RANK in namespaces of its own, the others as they are, as the
# containers of one machine run (Docker's default, a Kubernetes pod each): same kernel, same
# boot id, a namespace apart.
# usage: ns_rank.sh RANK UNSHARE-OPTIONS... -- COMMAND...  (CCQ_WORLD_RANK says whose turn)
set -eu
rank=$1
shift
opts=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    opts="$opts $1"
    shift
done
shift
if [ "${CCQ_WORLD_RANK:-}" = "$rank" ]; then
    # shellcheck disable=SC2086 # opts is a list of words
    exec unshare $opts "$@"
fi
exec "$@"
