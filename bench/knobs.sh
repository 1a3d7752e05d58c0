#!/usr/bin/env bash
# The knob sweep (docs/knobs.md): `pipeline bench` of bench/knobs.yaml, one interleaved run, the
# load average every minute beside it, then benchstat's verdict on each knob against its
# baseline: variant:none one at a time and 2 at once, variant:pooled,none on the pooled path;
# and each image's size. ROUNDS (default 9) and ONLY (default pandas) choose the run; with
# TXT=FILE, only the verdicts on that bench.txt. CONFIG (its output OUT) and KNOBS (the
# variants' names) run another sweep of the same shape: make bench-helpers.
set -euo pipefail
cd "$(dirname "$0")/.."
benchstat=${BENCHSTAT:-benchstat}
config=${CONFIG:-bench/knobs.yaml}
out=${OUT:-out-knobs}
knobs=${KNOBS:-"-background zero-pages host-settings=ignore ignore-cgroups app-huge-pages=false gc.collect gc.freeze malloc_trim"}
txt=${TXT:-}
if [ -z "$txt" ]; then
  load=$(mktemp /tmp/readie-knobs-load.XXXXXX)
  (while :; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >>"$load"; sleep 60; done) &
  sampler=$!
  trap 'kill $sampler 2>/dev/null || true; rm -f "$load"' EXIT
  bin/pipeline bench --capture --config "$config" --only "${ONLY:-pandas}" --concurrency 1,2 --rounds "${ROUNDS:-9}"
  echo "load average (1, 5, 15 min) during the run:"
  cat "$load"
  txt=$out/bench/latest/bench.txt
fi
compare() { # compare FILTER: benchstat of the lines FILTER selects, one column per series
  "$benchstat" -filter "$1" -col /series "$txt" | grep -v '^\(goos\|goarch\|pkg\|cpu\|runsc\|restore-flags\):' || true
}
echo "== image sizes (MiB, per series)"
awk '/^BenchmarkRestore\/.*series=variant:[^ ]*\/conc=1 / { split($1, p, "series="); sub(/\/conc=1$/, "", p[2]); size[p[2]] = $5 }
     END { for (s in size) print s, size[s] }' "$txt" | grep -v ':last-page ' | sort
echo "== core series"
compare '.name:Restore .unit:sec/op (/series:floor OR /series:restore OR /series:prestarted OR /series:pooled)'
for k in $knobs; do
  echo "== $k: one at a time, to the first answer, then to the last page loaded"
  compare ".name:Restore .unit:sec/op (/series:\"variant:none\" OR /series:\"variant:$k\")"
  compare ".name:Restore .unit:sec/op (/series:\"variant:none:last-page\" OR /series:\"variant:$k:last-page\")"
  echo "== $k: 2 at once, each restore to its answer, then restores/s of each batch"
  compare "/conc:2 (/series:\"variant:none\" OR /series:\"variant:$k\")"
  echo "== $k: pooled, to the first answer"
  compare ".name:Restore .unit:sec/op (/series:\"variant:pooled,none\" OR /series:\"variant:pooled,$k\")"
done
