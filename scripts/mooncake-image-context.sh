#!/usr/bin/env bash
# Collects the build context of the embcache-mooncake image (Dockerfile.mooncake),
# an image FROM scratch, since none can be pulled: bin/embcache-mooncake
# (make build-mooncake: cgo, it opens libmooncake_store.so at run time), a
# Mooncake install's bin/mooncake_master and lib/ (libmooncake_store.so,
# libasio.so), and every shared library those need as ldd lists them, the
# dynamic loader among them, each at the path ldd names (the loader at its
# PT_INTERP path), copied as files (symlinks followed).
#
#   scripts/mooncake-image-context.sh [OUT]    (default build/image-mooncake)
#
# MOONCAKE_DIR is the Mooncake install (default build/mooncake: make
# mooncake unpacks ../shared/mooncake's bundle there and installs the
# Debian packages its libraries need); BIN the embcache binary (default
# bin/embcache-mooncake). The context is made anew each time; nothing of
# it is tracked (build/ is ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/image-mooncake}
mc=${MOONCAKE_DIR:-build/mooncake}
bin=${BIN:-bin/embcache-mooncake}
for f in "$bin" "$mc/bin/mooncake_master" "$mc/lib/libmooncake_store.so" "$mc/lib/libasio.so"; do
  [ -f "$f" ] || { echo "mooncake-image-context: $f missing (make build-mooncake, make mooncake)" >&2; exit 1; }
done
mc_abs=$(cd "$mc" && pwd -P)

rm -rf "$out"
mkdir -p "$out/rootfs/mooncake/bin" "$out/rootfs/mooncake/lib"
cp Dockerfile.mooncake "$out/Dockerfile"
cp "$bin" "$out/rootfs/embcache"
cp "$mc/bin/mooncake_master" "$out/rootfs/mooncake/bin/"
cp "$mc/lib/libmooncake_store.so" "$mc/lib/libasio.so" "$out/rootfs/mooncake/lib/"
[ -f "$mc/LICENSE" ] && cp "$mc/LICENSE" "$out/rootfs/mooncake/"

# The libraries of each ELF file: the embcache binary, the master, and the
# libraries the binary opens (libmooncake_store.so is dlopen'd, so the
# binary's own ldd does not name its needs). ldd prints "name => /path
# (addr)", the loader as "/path (addr)", and linux-vdso without a path.
libs=$(for f in "$bin" "$mc/bin/mooncake_master" "$mc/lib/libmooncake_store.so" "$mc/lib/libasio.so"; do
  if ! ldd "$f" >/dev/null 2>&1; then echo "mooncake-image-context: ldd $f failed" >&2; ldd "$f" >&2; exit 1; fi
  ldd "$f" | awk '
    /=> not found/ { print "NOTFOUND " $1; next }
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }'
done | sort -u)
if grep -q '^NOTFOUND' <<<"$libs"; then
  echo "mooncake-image-context: libraries not found (make mooncake installs Mooncake's Debian packages):" >&2
  grep '^NOTFOUND' <<<"$libs" >&2
  exit 1
fi
n=0
while read -r lib; do
  [ -n "$lib" ] || continue
  real=$(readlink -f "$lib")
  case "$real" in "$mc_abs"/*) # Mooncake's own (libasio.so): beside libmooncake_store.so
    cp -L "$lib" "$out/rootfs/mooncake/lib/"
    continue ;;
  esac
  mkdir -p "$out/rootfs$(dirname "$lib")"
  cp -L "$lib" "$out/rootfs$lib"
  n=$((n + 1))
done <<<"$libs"
# The loader each executable names must be there (ldd lists it, but check).
for f in "$bin" "$mc/bin/mooncake_master"; do
  interp=$(readelf -l "$f" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
  [ -n "$interp" ] && [ -f "$out/rootfs$interp" ] || { echo "mooncake-image-context: $f's loader ${interp:-?} not collected" >&2; exit 1; }
done
echo "mooncake-image-context: $out: embcache, mooncake_master, libmooncake_store.so, libasio.so and $n system libraries" >&2
