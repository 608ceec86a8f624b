#!/bin/sh
# The network-partition drill: 4 processes, each in a network namespace of its own (as on 4
# machines), pods 0-1 on one bridge and 2-3 on another, the bridges joined by a link; host data
# over UCX's TCP (UCX_TLS=self,tcp: shared memory would cross any cut), meeting at a tcp://
# rendezvous that process 0 serves. A blip of 1 s, then three cuts, each healed 11 s later while
# the processes run:
#   2|2  the link between the bridges: {0,1} hold the lowest process, a quorum; {2,3} do not;
#   3    process 3's own link: {0,1,2} go on, 3 is alone;
#   0    process 0's own link: the server is cut off; {1,2,3} take the rendezvous over.
# Then two gray failures: the host data moves on a second network of its own (UCX_NET_DEVICES),
# and only a process's data link is cut, its heartbeats still flowing on the first: the UCX
# engines at both ends report each other, and job health's judge (runtime/health/judge.c) must
# lose exactly that process:
#   gray3  process 3's data link: {0,1,2} go on, 3 is fenced off;
#   gray0  process 0's data link (process 0 judges: it declares itself; it still serves the
#          rendezvous): {1,2,3} go on.
# Checked (tests/health/partition.c prints each process's END line): the quorum side ends alive,
# with a communicator over exactly its devices, and completed all_reduces on it (exact sums);
# every process of the other side ends fenced off (its own state lost) within
# 3 x heartbeat_timeout_ms + 6 s of the cut and completed none after the cut: the two sides
# never both go on (a split brain). Needs root (network namespaces); skips (77) without.
# usage: partition.sh DRILL_PARTITION
set -u
drill=$1
hb_ms=300                       # heartbeat_timeout_ms 3000: the cut-off side is fenced within 9 s
bound_ms=$((3 * 10 * hb_ms + 6000))
s=$(( $$ % 10000 ))
ns=ccqp$s
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add "${ns}-probe" 2>/dev/null; then
    echo "partition drill: needs root and ip netns (iproute2): skipped"
    exit 77
fi
ip netns del "${ns}-probe"
work=$(mktemp -d)
cleanup() {
    for i in 0 1 2 3; do
        ip netns pids "$ns-$i" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns-$i" 2>/dev/null
        ip link del "${ns}h$i" 2>/dev/null
    done
    for i in 0 1 2 3; do ip link del "${ns}d$i" 2>/dev/null; done
    ip link del "${ns}x" 2>/dev/null
    ip link del "${ns}A" 2>/dev/null
    ip link del "${ns}B" 2>/dev/null
    ip link del "${ns}D" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# The machines and the network between them (a kernel without bridges or veth pairs, as some
# containers have: skipped).
topology() {
    set -e
    ip link add "${ns}A" type bridge
    ip link add "${ns}B" type bridge
    ip link add "${ns}D" type bridge # the data network of the gray drills
    ip link add "${ns}x" type veth peer name "${ns}y"
    ip link set "${ns}x" master "${ns}A"
    ip link set "${ns}y" master "${ns}B"
    for i in 0 1 2 3; do
        ip netns add "$ns-$i"
        ip link add "${ns}h$i" type veth peer name "${ns}e$i"
        ip link set "${ns}e$i" netns "$ns-$i"
        if [ "$i" -lt 2 ]; then br=${ns}A; else br=${ns}B; fi
        ip link set "${ns}h$i" master "$br"
        ip link set "${ns}h$i" up
        ip -n "$ns-$i" addr add "10.99.0.$((i + 1))/24" dev "${ns}e$i"
        ip -n "$ns-$i" link set "${ns}e$i" up
        ip -n "$ns-$i" link set lo up
        ip link add "${ns}d$i" type veth peer name "${ns}f$i"
        ip link set "${ns}f$i" netns "$ns-$i"
        ip link set "${ns}d$i" master "${ns}D"
        ip link set "${ns}d$i" up
        ip -n "$ns-$i" addr add "10.98.0.$((i + 1))/24" dev "${ns}f$i"
        ip -n "$ns-$i" link set "${ns}f$i" up
    done
    for l in "${ns}A" "${ns}B" "${ns}D" "${ns}x" "${ns}y"; do ip link set "$l" up; done
}
# (Not in an if: errexit does not hold in a tested command, so a failed step would pass.)
(topology) >"$work/topology" 2>&1
built=$?
if [ $built != 0 ]; then
    echo "partition drill: cannot build the network (skipped):"
    cat "$work/topology"
    exit 77
fi

now_ms() { date +%s%3N; }

# drill NAME LINK QUORUM-RANKS OTHER-RANKS PORT-OFFSET [CUT-S [DATA]]: once every process did an
# all_reduce, cut LINK; heal it CUT-S (11) later; stop the processes 4 s after that; check. With
# no OTHER-RANKS (a blip): nobody is lost, nobody forms another communicator. DATA: the
# interface the host data takes in each namespace: e (the one the rendezvous takes, default) or
# f (the data network of its own).
fails=0
drill() {
    name=$1 link=$2 quorum=$3 others=$4
    port=$((29500 + $5))
    cut_s=${6:-11}
    data=${7:-e}
    pids=""
    for i in 0 1 2 3; do
        ip netns exec "$ns-$i" env CCQ_WORLD_RANK=$i CCQ_WORLD_SIZE=4 \
            CCQ_BOOTSTRAP=tcp://10.99.0.1:$port CCQ_HOST_ENGINE=ucx CCQ_HOST_DEVICES=1 \
            CCQ_HEARTBEAT_MS=$hb_ms CCQ_TIMEOUT_MS=30000 UCX_TLS=self,tcp \
            UCX_NET_DEVICES="${ns}$data$i" \
            timeout 150 "$drill" "$work/$name.stop" >"$work/$name.$i" 2>&1 &
        pids="$pids $!"
    done
    waited=0
    while [ "$(cat "$work/$name".[0-3] | grep -c '^ready$')" -lt 4 ] && [ $waited -lt 600 ]; do
        for p in $pids; do kill -0 "$p" 2>/dev/null || waited=600; done
        sleep 0.1
        waited=$((waited + 1))
    done
    sleep 1
    cut_ms=$(now_ms)
    ip link set "$link" down
    sleep "$cut_s"
    ip link set "$link" up
    sleep 4
    touch "$work/$name.stop"
    # shellcheck disable=SC2086 # a list of pids
    wait $pids
    want=$(echo "$quorum" | tr ' ' ',')
    for i in $quorum $others; do
        end=$(grep '^END ' "$work/$name.$i")
        ok=1
        case " $quorum " in
        *" $i "*)
            echo "$end" | grep -q "state=alive" || ok=0
            echo "$end" | grep -q " group=$want " || ok=0
            if [ -z "$others" ]; then
                echo "$end" | grep -q " after=0 " || ok=0 # a blip: no loss, no new communicator
            else
                echo "$end" | grep -q " after=0 " && ok=0
            fi
            ;;
        *)
            f=$(echo "$end" | sed -n 's/.*fenced_ms=\([0-9]*\).*/\1/p')
            echo "$end" | grep -q "state=lost" || ok=0
            echo "$end" | grep -q " after=0 " || ok=0
            [ -n "$f" ] && [ "$f" -gt 0 ] && [ $((f - cut_ms)) -le $bound_ms ] || ok=0
            [ -n "$f" ] && [ "$f" -gt 0 ] && end="$end (fenced $((f - cut_ms)) ms after the cut)"
            ;;
        esac
        if [ $ok = 1 ]; then
            echo "partition $name: process $i ok: $end"
        else
            echo "partition $name: process $i FAILED: ${end:-no END line}"
            sed 's/^/    /' "$work/$name.$i"
            fails=$((fails + 1))
        fi
    done
}

# A blip shorter than a third of heartbeat_timeout_ms (TCP's retransmission backoff stretches
# the silence an outage leaves): ridden out, nobody lost.
drill blip "${ns}h3" "0 1 2 3" "" 3 1
drill 2x2 "${ns}x" "0 1" "2 3" 0
drill alone3 "${ns}h3" "0 1 2" "3" 1
drill alone0 "${ns}h0" "1 2 3" "0" 2
drill gray3 "${ns}d3" "0 1 2" "3" 4 11 f
drill gray0 "${ns}d0" "1 2 3" "0" 5 11 f
[ $fails = 0 ] || { echo "partition drill: $fails processes failed"; exit 1; }
echo "partition drill: every cut left one side going on and fenced the other"
