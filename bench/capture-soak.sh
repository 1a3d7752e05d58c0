#!/usr/bin/env bash
# The capture soak (docs/reliability.md "Long runs"): the default config captured CAPTURES
# times in a row (200 by default) with --recapture into an output, a store and a TMPDIR of its
# own, pruning the store after each capture (`cache prune`, entries unused for a second and not
# in the output), and checking that the store, the output with its siblings and TMPDIR stay
# flat: after the first capture, none may grow by more than SLACK_MIB (16 by default) over its
# size then. Prints a line per capture and fails naming what grew. Needs `make capture`'s
# prerequisites.
set -euo pipefail
cd "$(dirname "$0")/.."
captures=${CAPTURES:-200}
slack=$(( ${SLACK_MIB:-16} << 20 ))
pipeline=bin/pipeline
work=$(mktemp -d /tmp/readie-capture-soak.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tmp" "$work/outdir"
sed "s#^checkpoint_cache: .*#checkpoint_cache: $work/store#; s#^rootfs: build/rootfs#rootfs: $PWD/build/rootfs#" pipeline.yaml > "$work/pipeline.yaml"
grep -q "^checkpoint_cache: $work/store" "$work/pipeline.yaml"
out=$work/outdir/out

bytes() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
printf 'capture seconds store_bytes output_bytes tmpdir_bytes tmpdir_entries\n'
base_store= base_out= base_tmp=
for i in $(seq "$captures"); do
  start=$(date +%s.%N)
  TMPDIR=$work/tmp "$pipeline" capture --config "$work/pipeline.yaml" --out "$out" --recapture >"$work/capture.out" 2>"$work/capture.log" ||
    { echo "capture $i failed:"; tail -20 "$work/capture.log"; exit 1; }
  end=$(date +%s.%N)
  sleep 1.1 # --older-than 1s: every entry the output does not use is prunable now
  TMPDIR=$work/tmp "$pipeline" cache prune --config "$work/pipeline.yaml" --older-than 1s "$out" >"$work/prune.out"
  store=$(bytes "$work/store") output=$(bytes "$work/outdir") tmp=$(bytes "$work/tmp")
  entries=$(find "$work/tmp" -mindepth 1 -maxdepth 1 | wc -l)
  printf '%d %.2f %d %d %d %d\n' "$i" "$(echo "$end - $start" | bc)" "$store" "$output" "$tmp" "$entries"
  if [ "$i" = 1 ]; then
    base_store=$store base_out=$output base_tmp=$tmp
  fi
  for what in store:$store:$base_store output:$output:$base_out tmpdir:$tmp:$base_tmp; do
    IFS=: read -r name now base <<<"$what"
    if (( now > base + slack )); then
      echo "capture-soak: the $name grew from $base to $now bytes after $i captures" >&2
      exit 1
    fi
  done
done
echo "capture-soak: $captures captures with --recapture; store, output and TMPDIR stayed within $((slack >> 20)) MiB of their size after the first"
