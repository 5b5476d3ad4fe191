#!/bin/sh
# bench-agent-key.sh: key construction through a real agent from Python
# (clients/python/bench_key.py), and the Go floor beside it in the same run:
# the cachekey package keying the same sizes in memory.
# Usage: scripts/bench-agent-key.sh [bench_key.py flags]
set -eu
cd "$(dirname "$0")/.."
GO=${GO:-go}
BENCH_SCRIPT=clients/python/bench_key.py scripts/bench-agent-hit.sh "$@"
echo "Go floor (cachekey, in memory; ns/op per size):"
$GO test -run '^$' -bench '^BenchmarkRawBytesKey$' -benchtime 200x ./cachekey/ | grep -E '^Benchmark'
