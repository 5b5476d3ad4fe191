#!/usr/bin/env bash
# Brings the compose cluster up, runs a workload through it, kills one NATS
# node a quarter of the way in, and checks that the workload completes with
# one encoder forward per unique input (plus at most one per lease the kill
# made a worker lose: the fencing refused that worker's commit). Tears everything down at the end.
# Works with docker-compose 1.29 and with `docker compose` v2.
set -euo pipefail
cd "$(dirname "$0")/.."
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
project="embcache-test-$$"
# The pull servers' token (docker-compose.yml's default is public).
EMBCACHE_PAYLOAD_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export EMBCACHE_PAYLOAD_TOKEN
dc() { "${compose[@]}" -p "$project" "$@"; }
cleanup() {
  status=$?
  if [ $status -ne 0 ]; then dc logs --no-color --tail 40 >&2 || true; fi
  dc down -v --remove-orphans >/dev/null 2>&1 || true
  exit $status
}
trap cleanup EXIT

docker build -q -t embcache:dev . >/dev/null
dc up -d
# Wait for the workers' healthchecks (they pass once their NATS is reachable).
for svc in encoder prefill1 prefill2 prefill3; do
  for i in $(seq 1 90); do
    state=$(docker inspect -f '{{.State.Health.Status}}' "$(dc ps -q "$svc")" 2>/dev/null || echo starting)
    [ "$state" = healthy ] && break
    [ "$i" = 90 ] && { echo "compose-test: $svc not healthy" >&2; exit 1; }
    sleep 1
  done
done

out=$(mktemp) progress=$(mktemp)
requests=600
dc run --rm -T loadgen loadgen --encoder http://encoder:8080 \
  --prefill http://prefill1:8080,http://prefill2:8080,http://prefill3:8080 \
  --requests $requests --unique 150 --concurrency 6 --timeout 4m >"$out" 2>"$progress" &
load=$!
# Kill a NATS node once a quarter of the requests are done.
for i in $(seq 1 600); do
  done_n=$( (tr '\r' '\n' <"$progress" | grep -o '[0-9]*/'"$requests" | tail -1 | cut -d/ -f1) || true)
  [ "${done_n:-0}" -ge $((requests / 4)) ] && break
  kill -0 "$load" 2>/dev/null || break
  sleep 0.1
done
echo "compose-test: killing nats2 after ${done_n:-0}/$requests requests" >&2
dc kill nats2 >/dev/null
if ! wait "$load"; then
  echo "compose-test: workload failed:" >&2; cat "$out" >&2; exit 1
fi
cat "$out"
grep -q '"forwards_ok": true' "$out"
echo "compose-test: passed" >&2
