#!/usr/bin/env bash
# Compares two revisions with `effectline bench`, runs interleaved (A, B, A,
# B, ...), and prints the median of each figure per revision.
#
#   scripts/bench-ab.sh [-r runs] REV_A REV_B [bench flags...]
#   scripts/bench-ab.sh main HEAD -n 10000
#   scripts/bench-ab.sh -r 6 HEAD~3 HEAD -n 5000 -rate 500
#
# REV is anything `git worktree add` takes; "." is the working tree as it is.
# On this project's 2-core machines the same binary's throughput swings by a
# third from one minute to the next, so only interleaved runs of both, with
# medians, tell a change from the weather (docs/benchmarks.md). The CPU time
# per operation is the steadiest of the figures. With -history the disk a
# retained operation takes is compared too.
set -euo pipefail

runs=4
if [ "${1:-}" = "-r" ]; then
  runs=$2
  shift 2
fi
if [ $# -lt 2 ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
rev_a=$1 rev_b=$2
shift 2

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-ab.XXXXXX")
cleanup() {
  for wt in "$work"/src-*; do
    [ -d "$wt" ] && git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

build() { # name rev
  local out="$work/$1"
  if [ "$2" = "." ]; then
    (cd "$root" && go build -o "$out" ./cmd/effectline)
  else
    git -C "$root" worktree add --detach "$work/src-$1" "$2" >/dev/null 2>&1
    (cd "$work/src-$1" && go build -o "$out" ./cmd/effectline)
  fi
}
build a "$rev_a"
build b "$rev_b"

for i in $(seq 1 "$runs"); do
  for side in a b; do
    line=$("$work/$side" bench "$@" 2>/dev/null | grep -E '^(cpu|bench|wait):|bytes per retained operation$' | grep -v 'queries' | tr '\n' ' ')
    echo "$side $line" | tee -a "$work/results"
  done
done

echo
echo "medians over $runs runs each (a = $rev_a, b = $rev_b; bench $*):"
awk '
  function median(list,   n, arr, i, j, t) {
    n = split(list, arr, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (arr[j] + 0 < arr[i] + 0) { t = arr[i]; arr[i] = arr[j]; arr[j] = t }
    return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
  }
  {
    side = $1
    mode = ""
    for (f = 2; f <= NF; f++) {
      # The wait: line (bench -wait) has p50/p99 of its own: POST to its 200.
      if ($f == "wait:" || $f == "bench:") mode = $f
      if ($f == "cpu:") cpu[side] = cpu[side] " " $(f + 1)
      # "0.91 ms in PostgreSQL[s] processes" where the database is on this machine.
      if ($f ~ /^PostgreSQL/ && $(f + 1) ~ /^processes/) pg[side] = pg[side] " " $(f - 3)
      if ($f ~ /^throughput=/) { v = $f; sub(/throughput=/, "", v); sub(/\/s/, "", v); tp[side] = tp[side] " " v }
      if ($f ~ /^p50=/) { v = $f; sub(/p50=/, "", v); sub(/ms/, "", v); if (mode == "wait:") w50[side] = w50[side] " " v; else p50[side] = p50[side] " " v }
      if ($f ~ /^p99=/) { v = $f; sub(/p99=/, "", v); sub(/ms/, "", v); if (mode == "wait:") w99[side] = w99[side] " " v; else p99[side] = p99[side] " " v }
      if ($f ~ /^tx_per_op=/) { v = $f; sub(/tx_per_op=/, "", v); tx[side] = tx[side] " " v }
      # -history prints the disk a retained operation takes.
      if ($f == "bytes" && $(f + 1) == "per" && $(f + 2) == "retained") { v = $(f - 1); sub(/;/, "", v); disk[side] = disk[side] " " v }
    }
  }
  END {
    for (s = 1; s <= 2; s++) {
      side = s == 1 ? "a" : "b"
      printf "%s: throughput=%.0f/s p50=%.1fms p99=%.1fms tx_per_op=%.2f cpu=%.2f ms/op",
        side, median(tp[side]), median(p50[side]), median(p99[side]), median(tx[side]), median(cpu[side])
      if (w50[side] != "") printf " post_to_200_p50=%.1fms post_to_200_p99=%.1fms", median(w50[side]), median(w99[side])
      if (pg[side] != "") printf " cpu_postgres=%.2f ms/op", median(pg[side])
      if (disk[side] != "") printf " disk=%.0f bytes/op", median(disk[side])
      printf "\n"
    }
    print "(p50 and p99: intent committed -> settled row projected; post_to_200: the POST with Prefer: wait to its 200, with -wait)"
  }' "$work/results"
