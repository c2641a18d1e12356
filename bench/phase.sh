# Sourced by the per-phase scripts (per_request.sh, preemptions.sh): starts one 10 s
# `waitroom-bench run` phase against a server the generator starts itself, and sets OUT
# (a temporary directory; the generator's table goes to $OUT/bench), BP (the generator)
# and SP (its server).
#
#   start_phase B MODE SCENARIO [waitroom-bench run arguments...]
start_phase() {
    local b=$1 mode=$2 sc=$3
    shift 3
    OUT=$(mktemp -d)
    "$b/waitroom-bench" run --bin "$b/waitroom" --scenario "$sc" --durability "$mode" \
        --duration 10 "$@" > "$OUT/bench" 2>&1 &
    BP=$!
    SP=
    for _ in $(seq 1 100); do
        SP=$(pgrep -P $BP -f waitroom | head -1 || true)
        [ -n "$SP" ] && break
        sleep 0.1
    done
}
