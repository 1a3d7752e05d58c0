#!/usr/bin/env bash
# Builds the executor's root filesystem from two layers:
#   1. the package layer (mmdebstrap, Debian bookworm, minbase + packages.txt), cached under
#      $READIE_CACHE/rootfs/layers/<hash of its inputs>, reused when present;
#   2. the executor layer (readie_executor, the test-only module, resolver files), staged apart
#      and hashed.
# The rootfs is the two together, in $READIE_CACHE/rootfs/sha256-<digest>/rootfs, named by the
# digest of both layers and never changed afterwards: manifests name it by path, so a changed
# executor makes a new directory and old ones stay until `pipeline cache prune-rootfs`.
# Prints the rootfs path on its last line and points build/rootfs at it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cache=${READIE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/readie}
suite=bookworm
mirror=${READIE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

packages=$(grep -v '^\s*#' "$here/packages.txt" | tr -s ' \n' ',' | sed 's/^,//;s/,$//')
[ -n "$packages" ] || { echo "build-image: $here/packages.txt lists no packages" >&2; exit 2; }

layer_hash=$( { echo "$suite $mirror minbase"; echo "$packages"; sed -n '/^# package layer/,/^# end package layer/p' "$0"; } | sha256sum | cut -c1-16)
layer="$cache/rootfs/layers/$layer_hash"

# package layer
if [ -f "$layer/complete" ]; then
  echo "build-image: package layer $layer_hash reused ($layer)" >&2
else
  command -v mmdebstrap >/dev/null || {
    echo "build-image: installing mmdebstrap" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
  }
  echo "build-image: building package layer $layer_hash: $packages" >&2
  rm -rf "$layer"
  mkdir -p "$layer"
  tmp="$layer/rootfs.tmp"
  mmdebstrap --variant=minbase --include="$packages" --quiet "$suite" "$tmp" "$mirror" >&2
  # Documentation and caches are dead weight in every sandbox; the resolver files belong to
  # the executor layer.
  rm -rf "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/lib/apt/lists/*
  rm -f "$tmp"/etc/resolv.conf "$tmp"/etc/hosts
  # Precompile the standard library: the root is read-only in the sandbox, so .pyc files
  # cannot be written at run time and every cold start would compile again.
  chroot "$tmp" python3 -m compileall -q -j0 /usr/lib/python3 /usr/lib/python3.11 >/dev/null 2>&1 || true
  mv "$tmp" "$layer/rootfs"
  (cd "$layer/rootfs" && find . -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1 > "$layer/digest"
  touch "$layer/complete"
fi
# end package layer

# executor layer, staged apart so that its digest covers exactly what it adds
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
site="$stage/usr/lib/python3/dist-packages/readie_executor"
mkdir -p "$site" "$stage/usr/lib/readie/testing" "$stage/etc"
cp "$here"/readie_executor/*.py "$site/"
cp "$here"/testing/*.py "$stage/usr/lib/readie/testing/"
# The root is read-only: /etc/resolv.conf points into the sandbox's /tmp, where the executor
# writes /etc/readie-resolv.conf before a call when no resolver is configured (the spec).
ln -s ../tmp/resolv.conf "$stage/etc/resolv.conf"
printf 'nameserver 1.1.1.1\nnameserver 8.8.8.8\noptions edns0\n' > "$stage/etc/readie-resolv.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\treadie\n' > "$stage/etc/hosts"
executor_digest=$(cd "$stage" && find . \( -type f -o -type l \) -print0 | LC_ALL=C sort -z |
  while IFS= read -r -d '' f; do
    if [ -L "$f" ]; then printf 'link %s %s\n' "$f" "$(readlink "$f")"; else printf 'file %s %s\n' "$f" "$(sha256sum < "$f" | cut -d' ' -f1)"; fi
  done | sha256sum | cut -d' ' -f1)
digest=$(printf '%s %s\n' "$(cat "$layer/digest")" "$executor_digest" | sha256sum | cut -d' ' -f1)

dir="$cache/rootfs/sha256-$digest"
rootfs="$dir/rootfs"
if [ -f "$dir/complete" ]; then
  echo "build-image: rootfs sha256:$digest reused ($dir)" >&2
else
  echo "build-image: assembling rootfs sha256:$digest" >&2
  tmp="$cache/rootfs/.tmp-$digest-$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # Hard links share the package layer's files: neither copy is ever written again.
  cp -al "$layer/rootfs" "$tmp/rootfs"
  cp -a "$stage"/. "$tmp/rootfs/"
  chroot "$tmp/rootfs" python3 -m compileall -q /usr/lib/python3/dist-packages/readie_executor >/dev/null
  cat > "$tmp/rootfs/usr/lib/readie/image.json" <<JSON
{
  "digest": "sha256:$digest",
  "package_layer": "$layer_hash",
  "package_layer_digest": "sha256:$(cat "$layer/digest")",
  "executor_digest": "sha256:$executor_digest",
  "packages": "$packages",
  "suite": "$suite"
}
JSON
  touch "$tmp/complete"
  # Atomic: another build of the same digest may have won; its rootfs is the same.
  if ! mv -T "$tmp" "$dir" 2>/dev/null; then
    rm -rf "$tmp"
    [ -f "$dir/complete" ] || { echo "build-image: cannot put $dir in place" >&2; exit 1; }
  fi
fi

mkdir -p "$top/build"
ln -sfn "$rootfs" "$top/build/rootfs"
echo "build-image: rootfs sha256:$digest" >&2
echo "$rootfs"
