#!/usr/bin/env bash
# The pipeline's image (make pipeline-image first): its size, a cold `podman pull` of it from a
# loopback registry (Debian's docker-registry), and a capture of the default sets (numpy,
# pandas; a fresh store each time) run in the image as the capture Job's pod runs it, beside
# the same capture run directly, alternating, ROUNDS rounds (default 3). Removes every image
# named */readie/pipeline from podman's storage before each pull (TestPipelineImageInPodman
# pulls it again).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
layout=build/pipeline-image
[ -f "$layout/index.json" ] || { echo "bench/pipeline-image.sh: no $layout: run make pipeline-image" >&2; exit 2; }
digest=$(grep -o 'sha256:[0-9a-f]\{64\}' "$layout/index.json" | head -n1)
runsc=$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/readie/runsc/*/runsc | head -n1)
work=$(mktemp -d /tmp/readie-bench-image.XXXXXX)
port=$(( 20000 + RANDOM % 20000 ))
image="127.0.0.1:$port/readie/pipeline@$digest"
cleanup() {
  [ -n "${reg:-}" ] && kill "$reg" 2>/dev/null; wait 2>/dev/null
  for d in "$work"/direct-*/run; do [ -d "$d" ] && while umount "$d/null-netns" 2>/dev/null; do :; done; done
  rm -rf "$work"
}
trap cleanup EXIT
seconds() { local s e; s=$(date +%s.%N); "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; return 1; }; e=$(date +%s.%N); echo "$e - $s" | bc; }
printf 'version: 0.1\nlog: {level: error, accesslog: {disabled: true}}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: 127.0.0.1:%s}\n' "$work/data" "$port" > "$work/registry.yml"
docker-registry serve "$work/registry.yml" >/dev/null 2>&1 & reg=$!
until curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; do sleep 0.05; done
skopeo copy -q --dest-tls-verify=false "oci:$layout" "docker://127.0.0.1:$port/readie/pipeline:bench"
echo "image $digest: $(du -sb --apparent-size "$layout/blobs" | cut -f1) bytes compressed in the layout"
nofile=$(ulimit -Hn); nproc=$(( $(ulimit -Hu) < 32768 ? $(ulimit -Hu) : 32768 ))
pod() { # the capture Job's pod, as TestPipelineImageInPodman runs it
  local d=$1
  mkdir -p "$d"/{config,cache,work,run,tmp}
  cp deploy/pipeline.yaml "$d/config/pipeline.yaml"
  podman --runtime runc run --rm --pull never --privileged --network none --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" \
    -v "$d/config:/etc/readie:ro" -v "$d/cache:/root/.cache/readie" -v "$d/work:/work" -v "$d/run:/run/readie" -v "$d/tmp:/tmp" \
    "$image" capture --config /etc/readie/pipeline.yaml --out /work/out
}
direct() { # the same capture on the host: the same runsc, the same rootfs, a fresh store
  local d=$1
  mkdir -p "$d"
  printf 'runsc: {path: %s, root: %s/run}\nrootfs: %s\ncheckpoint_cache: %s/cache\ncheckpoints:\n  - {id: numpy, imports: [numpy]}\n  - {id: pandas, imports: [pandas]}\n' \
    "$runsc" "$d" "$PWD/build/rootfs" "$d" > "$d/pipeline.yaml"
  bin/pipeline capture --config "$d/pipeline.yaml" --out "$d/out"
}
# runsc leaves a null-netns file mounted in its root.
unmount_root() { while umount "$1/null-netns" 2>/dev/null; do :; done; }
echo "round pull_s container_capture_s direct_capture_s ratio"
for r in $(seq "$rounds"); do
  # Every pipeline image podman holds (they share layers: the base, runsc and rootfs of one
  # build are another's), so that the pull is cold.
  podman images --format '{{.ID}} {{.Repository}}' | awk '$2 ~ /\/readie\/pipeline$|\/build\/pipeline-image$/ {print $1}' |
    sort -u | xargs -r podman rmi --force >/dev/null
  pull=$(seconds podman --runtime runc pull -q --tls-verify=false "$image")
  c=$(seconds pod "$work/pod-$r")
  d=$(seconds direct "$work/direct-$r")
  printf '%s %.2f %.2f %.2f %.2f\n' "$r" "$pull" "$c" "$d" "$(echo "$c / $d" | bc -l)"
  unmount_root "$work/direct-$r/run"
  rm -rf "$work/pod-$r" "$work/direct-$r"
done
