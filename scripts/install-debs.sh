#!/bin/sh
# install-debs.sh PACKAGE...: install the Debian packages that are missing
# (redis-server for the bench's Redis peer, python3-numpy for the Python
# client's zero-copy tests). Uses sudo when not root; runs apt-get update
# only when an install fails without it.
set -eu
missing=""
for p in "$@"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
command -v apt-get >/dev/null || { echo "install-debs: no apt-get here; install:$missing" >&2; exit 1; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo -n"
export DEBIAN_FRONTEND=noninteractive
echo "install-debs: installing$missing" >&2
$sudo apt-get install -y -q --no-install-recommends $missing >/dev/null ||
	{ $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends $missing >/dev/null; }
