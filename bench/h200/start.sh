#!/bin/bash
# First device call: start the whole bench in its own session (it outlives this command), then
# collect what is there after at most $1 seconds.
mkdir -p /tmp/h200-bench
setsid nohup bash bench/h200/all.sh "${@:2}" > /tmp/h200-bench/all.out 2>&1 < /dev/null &
sleep 2
exec bash bench/h200/collect.sh "${1:-540}"
