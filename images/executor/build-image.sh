#!/usr/bin/env bash
# Builds the executor's root filesystem from two layers:
#   1. the package layer (mmdebstrap, Debian bookworm, minbase + packages.txt), cached under
#      $READIE_CACHE/rootfs/layers/<hash of its inputs>, reused when present;
#   2. the executor layer (readie_executor, the test-only module, resolver files), put on by
#      `pipeline rootfs`.
# The rootfs is the two together, in $READIE_CACHE/rootfs/sha256-<digest>/rootfs, named by the
# digest of both layers and never changed afterwards: manifests name it by path, so a changed
# executor makes a new directory and old ones stay until `pipeline cache prune-rootfs`.
# Prints the rootfs path on its last line and points build/rootfs (or READIE_LINK) at it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cache=${READIE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/readie}
suite=bookworm
mirror=${READIE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# READIE_PACKAGES names another package list, READIE_LINK another link than build/rootfs
# (the size-sweep image of `make bench-sizes`).
packages_file=${READIE_PACKAGES:-$here/packages.txt}
link=${READIE_LINK:-$top/build/rootfs}
packages=$(grep -v '^\s*#' "$packages_file" | tr -s ' \n' ',' | sed 's/^,//;s/,$//')
[ -n "$packages" ] || { echo "build-image: $packages_file lists no packages" >&2; exit 2; }

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
  # cannot be written at run time and every cold start would compile again. This chroot runs
  # Debian's own python3 from packages apt verified, in the tree whose maintainer scripts
  # mmdebstrap has just run as root in a chroot: no user image's code (that runs only in
  # gVisor sandboxes: `pipeline rootfs`, `--image`).
  chroot "$tmp" python3 -m compileall -q -j0 /usr/lib/python3 /usr/lib/python3.11 >/dev/null 2>&1 || true
  mv "$tmp" "$layer/rootfs"
  # The digest covers what changes behaviour: every entry's type, mode (setuid included),
  # owner and link target, and every regular file's content.
  (cd "$layer/rootfs" && {
    find . -xdev -printf '%y %m %U:%G %p -> %l\n' | LC_ALL=C sort
    find . -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  }) | sha256sum | cut -d' ' -f1 > "$layer/digest"
  touch "$layer/complete"
fi
# end package layer

# The executor layer, by the pipeline itself (the same code puts it onto a user's image):
# readie_executor on python3's path, the test-only module, the resolver files; the rootfs is
# named by the digest of both layers and never written again.
pipeline=${READIE_PIPELINE:-$top/bin/pipeline}
[ -x "$pipeline" ] || { echo "build-image: $pipeline is missing: run \`make build\` first" >&2; exit 2; }
rootfs=$("$pipeline" rootfs --cache "$cache" --base "$layer/rootfs" --base-digest "sha256:$(cat "$layer/digest")")

mkdir -p "$(dirname "$link")"
ln -sfn "$rootfs" "$link"
# The default image is also known to the cache, so a config anywhere (the default rootfs is
# {cache}/rootfs/default) finds it, not only one beside build/.
if [ -z "${READIE_PACKAGES:-}" ]; then
  ln -sfn "$rootfs" "$cache/rootfs/default.tmp" && mv -T "$cache/rootfs/default.tmp" "$cache/rootfs/default"
fi
echo "build-image: rootfs $rootfs" >&2
echo "$rootfs"
