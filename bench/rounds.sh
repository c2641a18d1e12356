#!/bin/bash
# Issue 10, items 3 and 4 side by side: per round and per build, `/healthz`, join and
# status at 64 connections (5 s each, DUR=sync by default), and the ratios to `/healthz`.
#
#   bench/rounds.sh ROUNDS DIR...   # each DIR holds waitroom and waitroom-bench of one build
R=$1; shift
one() { "$1"/waitroom-bench run --bin "$1"/waitroom --scenario "$2" --durability "${DUR:-sync}" --connections 64 --duration 5 2>&1 | grep "^| $2"; }
for r in $(seq 1 "$R"); do for B in "$@"; do
  h=$(one "$B" healthz | awk -F'|' '{gsub(/[ ,]/,"",$4); print $4}')
  jl=$(one "$B" join)
  j=$(echo "$jl" | awk -F'|' '{gsub(/[ ,]/,"",$4); print $4}')
  p=$(echo "$jl" | awk -F'|' '{gsub(/ /,"",$7); print $7}')
  s=$(one "$B" status | awk -F'|' '{gsub(/[ ,]/,"",$4); print $4}')
  echo "$r $B healthz=$h join=$j p99=$p status=$s join/h=$(echo "scale=3; $j/$h" | bc) status/h=$(echo "scale=3; $s/$h" | bc)"
done; done
