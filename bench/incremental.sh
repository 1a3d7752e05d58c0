#!/usr/bin/env bash
# Incremental capture, side by side (docs/store.md): for ROUNDS rounds, a first
# capture of the default config into an empty output and store, a second with nothing
# changed, and a third after one set's imports changed; then the disk use of a reused
# checkpoint. Prints one line per run and the medians. Needs `make capture`'s prerequisites.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
pipeline=bin/pipeline
work=$(mktemp -d /tmp/readie-bench-incremental.XXXXXX)
trap 'rm -rf "$work"' EXIT
sed "s#^checkpoint_cache: .*#checkpoint_cache: $work/store#; s#^rootfs: build/rootfs#rootfs: $PWD/build/rootfs#" pipeline.yaml > "$work/base.yaml"
sed 's#imports: \[numpy\]#imports: [numpy, json]#' "$work/base.yaml" > "$work/changed.yaml"
grep -q 'imports: \[numpy, json\]' "$work/changed.yaml"

seconds() { # seconds CONFIG LOG: wall time of one capture into $work/out, in seconds
  local start end
  start=$(date +%s.%N)
  "$pipeline" capture --config "$1" --out "$work/out" >"$2.out" 2>"$2"
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
# set_seconds LOG SET: what one set cost in a run, from the log: its capture, its timed
# restores and its smoke test (with --jobs > 1 other sets run beside them, so wall-clock spans
# would overlap)
set_seconds() {
  grep "set=$2" "$1" | awk '
    function secs(v) { return v ~ /ms$/ ? substr(v, 1, length(v) - 2) / 1000 : substr(v, 1, length(v) - 1) }
    /capture: done|measure: done/ { for (i = 1; i <= NF; i++) if ($i ~ /^took=/) total += secs(substr($i, 6)) }
    /smoke: ok/ { for (i = 1; i <= NF; i++) if ($i ~ /^ready_ms=/) total += substr($i, 10) / 1000 }
    END { printf "%.3f\n", total }'
}

{ printf 'round first_s second_s changed_s numpy_in_first_s second/first changed/(numpy+0.2*rest)\n'
for r in $(seq "$rounds"); do
  rm -rf "$work/out" "$work/store"
  first=$(seconds "$work/base.yaml" "$work/first.log")
  second=$(seconds "$work/base.yaml" "$work/second.log")
  changed=$(seconds "$work/changed.yaml" "$work/changed.log")
  numpy=$(set_seconds "$work/first.log" numpy)
  grep -q 'set=numpy status=captured' "$work/changed.log"
  ! grep -q 'set=pandas status=captured' "$work/changed.log"
  printf '%s %.2f %.2f %.2f %.2f %.3f %.3f\n' "$r" "$first" "$second" "$changed" "$numpy" \
    "$(echo "$second / $first" | bc -l)" "$(echo "$changed / ($numpy + 0.2 * ($first - $numpy))" | bc -l)"
done; } | tee "$work/rows"
median() { tail -n +2 "$work/rows" | cut -d' ' -f"$1" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'; }
printf 'median first %s s, second %s s (%s of the first), changed %s s (%s of numpy + 0.2 x the rest)\n' \
  "$(median 2)" "$(median 3)" "$(median 6)" "$(median 4)" "$(median 7)"

# Disk: a reused pandas checkpoint adds no image bytes (hard links into the store).
"$pipeline" capture --config "$work/base.yaml" --out "$work/out2" >/dev/null 2>&1
echo "du of the store, then of a second output that reuses every checkpoint (du counts a hard-linked file once):"
du -sh "$work/store" "$work/out2"
echo "du of the second output alone:"
du -sh "$work/out2"
stat -c '%h links  %s bytes  %n' "$work/out2/pandas/pages.img"
