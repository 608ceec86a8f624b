#!/bin/sh
# examples/world.c under the real torchrun (docs/multiprocess.md): its agent serves torch's
# store at MASTER_PORT, and ccq meets through it (torchstore://). One node of 2 processes, one
# standalone (c10d) of 3, two agents of a 2-node job on this machine, and a restart: the first
# attempt's process 0 fails after its work, the second's comes 2 s late (the store still holds
# the first attempt's port). Skipped (77) where torch is not installed: CCQ_TORCH_PYTHON names
# a python with torch (.ci/run installs one), else python3.
# Usage: torchrun_world.sh <dir of ccq_world>
set -u
bin=$1
py=${CCQ_TORCH_PYTHON:-python3}
"$py" -c "import torch.distributed.run" 2>/dev/null || { echo "no torch: skipped"; exit 77; }
free_port_py=$(cd "$(dirname "$0")" && pwd)/free_port.py
tmp=$(mktemp -d /tmp/ccq-torchrun-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$bin" || exit 1
export CCQ_TIMEOUT_MS=30000
fail=0

# run NAME WANT ARGS...: torchrun ARGS, then WANT lines "the world over ... OK" in its output.
run() {
    name=$1 want=$2
    shift 2
    timeout 150 "$py" -m torch.distributed.run "$@" >"$tmp/$name" 2>&1
    rc=$?
    got=$(grep -c "the world over .* devices: OK" "$tmp/$name")
    if [ "$rc" -ne 0 ] || [ "$got" -ne "$want" ]; then
        echo "FAIL $name: torchrun exit $rc, $got of $want processes OK" >&2
        grep -v "UserWarning\|_conversion_method\|^W[0-9]" "$tmp/$name" | tail -20 >&2
        fail=1
    else
        echo "ok $name ($got processes)"
    fi
}

run one_node 2 --nproc-per-node 2 --master-port "$(python3 "$free_port_py")" --no-python ./ccq_world
run standalone 3 --standalone --nproc-per-node 3 --no-python ./ccq_world

port=$(python3 "$free_port_py")
for n in 0 1; do
    run "node$n" 2 --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$port" \
        --nproc-per-node 2 --no-python ./ccq_world &
done
wait
for n in 0 1; do
    got=$(grep -c "the world over 8 devices: OK" "$tmp/node$n")
    [ "$got" -eq 2 ] || { echo "FAIL node$n: $got of 2 saw a world of 8 devices" >&2; fail=1; }
done

cat >"$tmp/attempts.sh" <<'EOF'
#!/bin/sh
[ "$TORCHELASTIC_RESTART_COUNT" = 1 ] && [ "$RANK" = 0 ] && sleep 2
./ccq_world || exit 2
[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ] && exit 1
exit 0
EOF
chmod +x "$tmp/attempts.sh"
run restart 4 --nproc-per-node 2 --max-restarts 1 --master-port "$(python3 "$free_port_py")" \
    --no-python "$tmp/attempts.sh"
exit $fail
