#!/usr/bin/env bash
# Fails when git tracks a file over 1 MiB or an executable build output
# (an ELF binary): build outputs belong in bin/, which is ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	size=$(stat -c %s "$f")
	if [ "$size" -gt 1048576 ]; then
		echo "tracked file over 1 MiB: $f ($size bytes)"
		status=1
	fi
	if [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]; then
		echo "tracked executable (ELF): $f"
		status=1
	fi
done < <(git ls-files -z)
exit $status
