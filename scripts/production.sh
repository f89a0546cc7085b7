#!/usr/bin/env bash
# Production start: migrate, check, then N daphne web processes and M workers (tasks + the sweep).
#
#   DATABASE_URL=postgres://… REDIS_URL=redis://… SECRET_KEY=… ALLOWED_HOSTS=agentrun.example.com \
#   AGENTRUN_HTTPS=1 AGENTRUN_WEB_PROCESSES=2 AGENTRUN_WORKERS=2 scripts/production.sh
#
# Web processes listen on PORT, PORT+1, …; put a load balancer (with websocket support) in front.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WEB=${AGENTRUN_WEB_PROCESSES:-2}
WORKERS=${AGENTRUN_WORKERS:-2}
PORT=${PORT:-8000}
BIND=${BIND:-127.0.0.1}
: "${DATABASE_URL:?set DATABASE_URL (postgres://…)}"
: "${REDIS_URL:?set REDIS_URL (redis://…)}"
: "${SECRET_KEY:?set SECRET_KEY (the same for every process)}"
export AGENTRUN_TASK_BACKEND=${AGENTRUN_TASK_BACKEND:-django_tasks_db.DatabaseBackend}

"$PY" manage.py migrate --noinput
"$PY" manage.py check --deploy --fail-level WARNING

trap 'kill 0' INT TERM EXIT
for i in $(seq 0 $((WEB - 1))); do
  # Workers sweep; the web processes need not.
  AGENTRUN_EMBEDDED_SWEEPER=0 "$PY" -m agentrun.daphne_ws -b "$BIND" -p $((PORT + i)) agentrun.asgi:application &
done
for i in $(seq 1 "$WORKERS"); do
  "$PY" manage.py agentrun_worker --interval 0.2 &
done
wait -n
