#!/usr/bin/env bash
# Peak memory (max RSS, /usr/bin/time) of `pipeline push` of an output of 1 set (pandas) and of
# 12 sets (bench/twelve-sets.yaml) to a local registry (Debian's docker-registry on a loopback
# port), ROUNDS rounds alternating, each push into a fresh repository (it uploads every
# layer). OLD=BINARY measures another pipeline binary beside bin/pipeline in the same rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
work=$(mktemp -d /tmp/readie-bench-rss.XXXXXX)
port=$(( 20000 + RANDOM % 20000 ))
cleanup() { [ -n "${reg:-}" ] && kill "$reg" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
capture() { # NAME CHECKPOINTS-YAML
  { echo "rootfs: $PWD/build/rootfs"; cat "$2"; } > "$work/$1.yaml"
  bin/pipeline capture --config "$work/$1.yaml" --out "$work/$1" >/dev/null 2>&1 || { echo "capture of $1 failed" >&2; exit 1; }
}
printf 'checkpoints:\n  - id: pandas\n    imports: [pandas]\n' > "$work/one-set.yaml"
capture one "$work/one-set.yaml"
capture twelve bench/twelve-sets.yaml
printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: 127.0.0.1:%s}\n' "$work/data" "$port" > "$work/config.yml"
docker-registry serve "$work/config.yml" >/dev/null 2>&1 & reg=$!
until curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; do sleep 0.05; done
binaries="new=bin/pipeline${OLD:+ old=$OLD}"
echo "output bytes: one $(du -sb --apparent-size "$work/one" | cut -f1), twelve $(du -sb --apparent-size "$work/twelve" | cut -f1)"
echo "round binary output max_rss_kib seconds"
for r in $(seq "$rounds"); do
  for b in $binaries; do
    for out in one twelve; do
      start=$(date +%s.%N)
      rss=$(/usr/bin/time -f %M "${b#*=}" push --config "$work/$out.yaml" --out "$work/$out" "127.0.0.1:$port/rss/r$r-${b%%=*}-$out:v1" 2>&1 >/dev/null | tail -1)
      echo "$r ${b%%=*} $out $rss $(echo "$(date +%s.%N) - $start" | bc)"
    done
  done
done | tee "$work/rows"
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "medians: binary output max_rss_mib seconds"
for b in $binaries; do
  for out in one twelve; do
    rows=$(awk -v b="${b%%=*}" -v o="$out" '$2 == b && $3 == o' "$work/rows")
    rss=$(echo "$rows" | awk '{print $4}' | median)
    secs=$(echo "$rows" | awk '{print $5}' | median)
    printf '%s %s %.1f %.2f\n' "${b%%=*}" "$out" "$(echo "$rss / 1024" | bc -l)" "$secs"
  done
done
