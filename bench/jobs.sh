#!/usr/bin/env bash
# Parallel capture, side by side (docs/fleet.md): the six-set config of
# bench/six-sets.yaml captured with --jobs 1 and --jobs 2, alternating, ROUNDS rounds, every
# set captured afresh (--recapture); then the medians, their ratio, and from the logs what one
# set costs (capture + smoke, and its timed restores).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
work=$(mktemp -d /tmp/readie-bench-jobs.XXXXXX)
trap 'rm -rf "$work"' EXIT
{ cat bench/six-sets.yaml; echo "rootfs: $PWD/build/rootfs"; echo "checkpoint_cache: $work/store"; } > "$work/six.yaml"

seconds() { # seconds JOBS LOG
  local start end
  start=$(date +%s.%N)
  bin/pipeline capture --config "$work/six.yaml" --out "$work/out-$1" --recapture --jobs "$1" >/dev/null 2>"$2"
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
# phase LOG: seconds from the first "capture: start" to the last "smoke: ok" (the parallel
# phase) and from there to the last "measure: done" (the timed restores, one at a time)
phases() {
  awk '{ gsub(/time="|"/, "", $1); split($1, t, ":"); s = t[1]*3600 + t[2]*60 + t[3] }
    /capture: start/ && first == "" { first = s } /smoke: ok/ { smoke = s } /measure: done/ { measure = s }
    END { printf "%.2f %.2f", smoke - first, measure - smoke }' "$1"
}
echo "round jobs1_s jobs2_s ratio jobs1_parallel_s jobs1_timed_s jobs2_parallel_s jobs2_timed_s"
for r in $(seq "$rounds"); do
  one=$(seconds 1 "$work/one.log"); two=$(seconds 2 "$work/two.log")
  printf '%s %.2f %.2f %.3f %s %s\n' "$r" "$one" "$two" "$(echo "$one / $two" | bc -l)" "$(phases "$work/one.log")" "$(phases "$work/two.log")"
done | tee "$work/rows"
median() { cut -d' ' -f"$1" "$work/rows" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'; }
echo "median: jobs 1 $(median 2) s, jobs 2 $(median 3) s, ratio $(median 4); parallel phase $(median 5) -> $(median 7) s, timed restores $(median 6) -> $(median 8) s"
echo "per set, from the last --jobs 1 log (capture took, measure took):"
grep -E 'capture: done|measure: done' "$work/one.log" | sed -E 's/.*msg="([a-z]+): done".*set=([a-z0-9_-]+) took=([0-9.]+m?s).*/\2 \1 \3/'
