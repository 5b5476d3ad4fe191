#!/bin/sh
# bench-agent-hit.sh: a Python hit of an 8 MiB tensor through a real agent
# (embedded NATS + `embcache agent`), against reading the bytes from a file.
# Usage: scripts/bench-agent-hit.sh [bench_hit.py flags]; BENCH_SCRIPT runs
# another script against the same agent (make bench-vllm: bench_vllm.py).
set -eu
cd "$(dirname "$0")/.."
BIN=${EMBCACHE_BIN:-bin/embcache}
PYTHON=${PYTHON:-python3}
dir=$(mktemp -d)
shm=$(mktemp -d -p /dev/shm embcache-bench-XXXXXX 2>/dev/null || mktemp -d)
port=$($PYTHON -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" serve --port "$port" --store-dir "$dir/nats" --shm-dir "$shm/serve" --no-reconciler --node serve >"$dir/serve.log" 2>&1 &
serve=$!
"$BIN" agent --nats "nats://127.0.0.1:$port" --socket "$dir/agent.sock" --shm-dir "$shm/agent" --node agent >"$dir/agent.log" 2>&1 &
agent=$!
trap 'kill $agent $serve 2>/dev/null; wait $agent $serve 2>/dev/null; rm -rf "$dir" "$shm"' EXIT
i=0
until [ -S "$dir/agent.sock" ]; do
	i=$((i + 1))
	[ $i -gt 200 ] && { cat "$dir/agent.log"; exit 1; }
	sleep 0.05
done
"$PYTHON" ${BENCH_SCRIPT:-clients/python/bench_hit.py} --socket "$dir/agent.sock" "$@"
