#!/usr/bin/env bash
# Builds the executor's root filesystem:
#   1. the package layer (mmdebstrap, Debian bookworm, minbase + packages.txt), cached under
#      $READIE_CACHE/rootfs/<hash of its inputs>, reused when present;
#   2. the executor layer (readie_executor, resolver config, image.json), written afresh on
#      every build so a changed executor never runs against a stale copy.
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
layer="$cache/rootfs/$layer_hash"
rootfs="$layer/rootfs"

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
  # Documentation and caches are dead weight in every sandbox.
  rm -rf "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/lib/apt/lists/*
  # Precompile the standard library: the root is read-only in the sandbox, so .pyc files
  # cannot be written at run time and every cold start would compile again.
  chroot "$tmp" python3 -m compileall -q -j0 /usr/lib/python3 /usr/lib/python3.11 >/dev/null 2>&1 || true
  mv "$tmp" "$rootfs"
  (cd "$rootfs" && find . -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1 > "$layer/digest"
  touch "$layer/complete"
fi
# end package layer

# executor layer
site="$rootfs/usr/lib/python3/dist-packages/readie_executor"
rm -rf "$site"
mkdir -p "$site"
cp "$here"/readie_executor/*.py "$site/"
chroot "$rootfs" python3 -m compileall -q /usr/lib/python3/dist-packages/readie_executor >/dev/null
printf 'nameserver 127.0.0.53\noptions edns0\n' > "$rootfs/etc/readie-resolv.conf"
cp "$rootfs/etc/readie-resolv.conf" "$rootfs/etc/resolv.conf"

executor_digest=$( (cd "$here" && LC_ALL=C sha256sum readie_executor/*.py) | sha256sum | cut -d' ' -f1)
digest=$(printf '%s %s\n' "$(cat "$layer/digest")" "$executor_digest" | sha256sum | cut -d' ' -f1)
mkdir -p "$rootfs/usr/lib/readie"
cat > "$rootfs/usr/lib/readie/image.json.tmp" <<JSON
{
  "digest": "sha256:$digest",
  "package_layer": "$layer_hash",
  "package_layer_digest": "sha256:$(cat "$layer/digest")",
  "executor_digest": "sha256:$executor_digest",
  "packages": "$packages",
  "suite": "$suite"
}
JSON
mv "$rootfs/usr/lib/readie/image.json.tmp" "$rootfs/usr/lib/readie/image.json"

mkdir -p "$top/build"
ln -sfn "$rootfs" "$top/build/rootfs"
echo "build-image: rootfs sha256:$digest" >&2
echo "$rootfs"
