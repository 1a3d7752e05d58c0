#!/usr/bin/env bash
# Push and pull of an output to a local registry (Debian's docker-registry on a loopback
# port), ROUNDS rounds: a first push into an empty registry, a pull, and a second push after
# one set changed (bytes the registry stored for it). Needs a captured output: OUT (default out).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
out=${OUT:-out}
[ -f "$out/manifest.json" ] || { echo "bench/oci.sh: $out holds no output: run make capture" >&2; exit 2; }
work=$(mktemp -d /tmp/readie-bench-oci.XXXXXX)
port=$(( 20000 + RANDOM % 20000 ))
cleanup() { [ -n "${reg:-}" ] && kill "$reg" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
bytes=$(du -sb --apparent-size "$out" | cut -f1)
seconds() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
# A changed set: the same output with one set's imports changed, captured into $work/changed.
sed 's#imports: \[numpy\]#imports: [numpy, json]#' pipeline.yaml > "$work/changed.yaml"
sed -i "s#^rootfs: build/rootfs#rootfs: $PWD/build/rootfs#" "$work/changed.yaml"
cp -al "$out" "$work/base"
bin/pipeline capture --config "$work/changed.yaml" --out "$work/base" >/dev/null 2>&1 || { echo "capture of the changed output failed" >&2; exit 1; }

echo "round push_s push_MBps pull_s pull_MBps second_push_s second_push_stored_bytes"
for r in $(seq "$rounds"); do
  rm -rf "$work/data" "$work/pulled"
  printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: 127.0.0.1:%s}\n' "$work/data" "$port" > "$work/config.yml"
  docker-registry serve "$work/config.yml" >/dev/null 2>&1 & reg=$!
  until curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; do sleep 0.05; done
  push=$(seconds bin/pipeline push --out "$out" "127.0.0.1:$port/readie/checkpoints:v1")
  pull=$(seconds bin/pipeline pull "127.0.0.1:$port/readie/checkpoints:v1" "$work/pulled")
  before=$(du -sb "$work/data" | cut -f1)
  second=$(seconds bin/pipeline push --out "$work/base" "127.0.0.1:$port/readie/checkpoints:v2")
  after=$(du -sb "$work/data" | cut -f1)
  printf '%s %.2f %.0f %.2f %.0f %.2f %s\n' "$r" "$push" "$(echo "$bytes / $push / 1000000" | bc -l)" "$pull" \
    "$(echo "$bytes / $pull / 1000000" | bc -l)" "$second" "$((after - before))"
  kill "$reg"; wait "$reg" 2>/dev/null || true; reg=""
done
echo "output: $bytes bytes uncompressed; MB/s are of the uncompressed output"
