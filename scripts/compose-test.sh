#!/usr/bin/env bash
# Brings the compose cluster up, runs a workload through it, kills one NATS
# node a quarter of the way in, and checks that the workload completes with
# one encoder forward per unique input (plus at most one per lease the kill
# made a worker lose: the fencing refused that worker's commit). Tears everything down at the end.
#
# scripts/compose-test.sh mooncake: the cluster with docker-compose.mooncake.yml
# over it (a mooncake_master, the reconciler holding the store's segment,
# the workers writing and pulling through Mooncake). It needs
# bin/embcache-mooncake (make build-mooncake) and a Mooncake install in
# $MOONCAKE_DIR (default build/mooncake: make mooncake). No NATS node is
# killed: it checks exactly one forward per unique input, each value put
# into Mooncake once (the master's counters), the workers' pulled bytes
# (their /metrics) equal to their pulls times the value's size with no pull
# error, and that SIGTERM stops the Mooncake processes cleanly (exit 0).
# Works with docker-compose 1.29 and with `docker compose` v2.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-http}
case "$mode" in http | mooncake) ;; *) echo "usage: $0 [mooncake]" >&2; exit 2 ;; esac
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
files=(-f docker-compose.yml)
[ "$mode" = mooncake ] && files+=(-f docker-compose.mooncake.yml)
project="embcache-test-$mode-$$"
# The pull servers' token (docker-compose.yml's default is public).
EMBCACHE_PAYLOAD_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export EMBCACHE_PAYLOAD_TOKEN
dc() { "${compose[@]}" -p "$project" "${files[@]}" "$@"; }
cleanup() {
  status=$?
  if [ $status -ne 0 ]; then dc logs --no-color --tail 40 >&2 || true; fi
  dc down -v --remove-orphans >/dev/null 2>&1 || true
  exit $status
}
trap cleanup EXIT
fail() { echo "compose-test ($mode): $*" >&2; exit 1; }

docker build -q -t embcache:dev . >/dev/null
if [ "$mode" = mooncake ]; then
  scripts/mooncake-image-context.sh build/image-mooncake
  docker build -q -t embcache-mooncake:dev build/image-mooncake >/dev/null
fi
dc up -d
# Wait for the workers' healthchecks (they pass once their NATS is reachable).
for svc in encoder prefill1 prefill2 prefill3; do
  for i in $(seq 1 90); do
    state=$(docker inspect -f '{{.State.Health.Status}}' "$(dc ps -q "$svc")" 2>/dev/null || echo starting)
    [ "$state" = healthy ] && break
    [ "$i" = 90 ] && fail "$svc not healthy"
    sleep 1
  done
done
if [ "$mode" = mooncake ]; then
  # The segment holder says ready once its store is open and its segment
  # mounted: before that, a worker's put finds no memory to write to.
  holder=$(dc ps -q reconciler)
  deadline=$((SECONDS + 60))
  until docker logs "$holder" 2>&1 | grep 'embcache serve: ready' >/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "the reconciler (the segment holder) not ready in 60 s"
    sleep 0.2
  done
fi

# A service's address on the compose network, which this host reaches (the
# network publishes no port): the Docker engine must be this host's.
addr() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(dc ps -q "$1")"; }

out=$(mktemp) progress=$(mktemp)
if [ "$mode" = mooncake ]; then requests=300 unique=60; else requests=600 unique=150; fi
dc run --rm -T loadgen loadgen --encoder http://encoder:8080 \
  --prefill http://prefill1:8080,http://prefill2:8080,http://prefill3:8080 \
  --requests $requests --unique $unique --concurrency 6 --timeout 4m >"$out" 2>"$progress" &
load=$!
if [ "$mode" = http ]; then
  # Kill a NATS node once a quarter of the requests have reached the
  # encoder (each goes there first), as its /v1/stats counts them
  # (loadgen prints its progress only at the end when not on a terminal).
  encoder=$(addr encoder)
  while :; do
    done_n=$( (curl -fsS -m 2 "http://$encoder:8080/v1/stats" | grep -o '"requests":[0-9]*' | cut -d: -f2) || true)
    [ "${done_n:-0}" -ge $((requests / 4)) ] && break
    kill -0 "$load" 2>/dev/null || break
    sleep 0.1
  done
  if ! kill -0 "$load" 2>/dev/null; then
    cat "$out" "$progress" >&2
    fail "the workload ended before nats2 was killed (${done_n:-0}/$requests requests seen)"
  fi
  echo "compose-test: killing nats2 after ${done_n:-0}/$requests requests" >&2
  dc kill nats2 >/dev/null
fi
if ! wait "$load"; then
  echo "compose-test: workload failed:" >&2; cat "$out" >&2; exit 1
fi
cat "$out"
grep -q '"forwards_ok": true' "$out" || fail "forwards not ok"
if [ "$mode" = http ]; then
  echo "compose-test: passed" >&2
  exit 0
fi

grep -q '"forwards_equal_unique_inputs": true' "$out" || fail "encoder forwards != $unique unique inputs"
# The services' Prometheus endpoints.
metrics() { # service port
  local ip
  ip=$(addr "$1")
  curl -fsS -m 5 "http://$ip:$2/metrics" || fail "no metrics from $1 at $ip:$2 (is this host on the compose network's bridge?)"
}
# sum NAME: the sum of a metric's samples (every label set) on stdin.
sum() { awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f\n", s }'; }
master=$(metrics mooncake-master 9003)
keys=$(sum master_key_count <<<"$master")
puts=$(sum master_put_end_requests_total <<<"$master")
allocated=$(sum master_allocated_bytes <<<"$master")
gets=$(sum master_get_replica_list_requests_total <<<"$master")
[ "$keys" = "$unique" ] && [ "$puts" = "$unique" ] ||
  fail "the Mooncake master holds $keys keys after $puts puts, want $unique of each"
size=$((allocated / keys))
pulled=0 pulls=0 errors=0
for svc in encoder prefill1 prefill2 prefill3; do
  m=$(metrics "$svc" 9090)
  b=$(sum embcache_pull_bytes_total <<<"$m") p=$(sum embcache_pull_duration_seconds_count <<<"$m") e=$(sum embcache_pull_errors_total <<<"$m")
  echo "compose-test: $svc pulled $b bytes in $p pulls through Mooncake ($e errors)" >&2
  pulled=$((pulled + b)) pulls=$((pulls + p)) errors=$((errors + e))
done
[ "$pulls" -gt 0 ] || fail "no worker pulled a value"
[ "$errors" = 0 ] || fail "$errors pull errors"
[ "$pulled" = $((pulls * size)) ] || fail "$pulled bytes pulled in $pulls pulls, want $((pulls * size)) ($size a value)"
[ "$gets" -ge "$pulls" ] || fail "the master answered $gets replica lists for $pulls pulls"
echo "compose-test: $unique values of $size bytes put into Mooncake once each; $pulls pulls moved $pulled bytes through it" >&2

# Mooncake's library takes SIGTERM over in the processes that open a
# store: each must still stop on it, cleanly, well before stop's SIGKILL.
dc stop -t 30 encoder prefill1 prefill2 prefill3 reconciler >/dev/null 2>&1
for svc in encoder prefill1 prefill2 prefill3 reconciler; do
  code=$(docker inspect -f '{{.State.ExitCode}}' "$(dc ps -q "$svc")")
  [ "$code" = 0 ] || fail "$svc exited $code on SIGTERM"
done
docker logs "$holder" 2>&1 | grep 'embcache serve: stopped' >/dev/null || fail "the reconciler did not say stopped"
echo "compose-test: passed" >&2
