#!/bin/sh
# Fails if docs/reliability.md's validation table differs from `test_validation --markdown`.
# Usage: check_doc_table.sh <test_validation binary> <docs/reliability.md>
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$1" --markdown > "$tmp/want"
sed -n '/validation-table:begin/,/validation-table:end/p' "$2" | grep '^|' > "$tmp/have"
if ! diff -u "$tmp/have" "$tmp/want"; then
    echo "docs/reliability.md is out of date: paste the output of '$1 --markdown' between the" >&2
    echo "validation-table markers" >&2
    exit 1
fi
