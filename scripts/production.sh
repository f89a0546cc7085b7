#!/usr/bin/env bash
# Production start on one machine: migrate, check, then N web processes, M workers and the
# notifications workers (webhooks, email) under agentrun.server.supervisor (a dead process is restarted with
# backoff, the others untouched; SIGTERM stops them all within AGENTRUN_DRAIN_SECONDS + 5 s).
# README "Production" has the whole story.
#
#   DATABASE_URL=postgres://… REDIS_URL=redis://… SECRET_KEY=… ALLOWED_HOSTS=agentrun.example.com \
#   AGENTRUN_HTTPS=1 EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend \
#   AGENTRUN_WEB_PROCESSES=2 AGENTRUN_WORKERS=2 scripts/production.sh
#
# Web processes listen on PORT, PORT+1, …; put a load balancer (with websocket support) in front.
# One process per container instead: deploy/Procfile and deploy/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WEB=${AGENTRUN_WEB_PROCESSES:-2}
WORKERS=${AGENTRUN_WORKERS:-2}
NOTIFY_WORKERS=${AGENTRUN_NOTIFY_WORKERS:-1}
PORT=${PORT:-8000}
BIND=${BIND:-127.0.0.1}
: "${DATABASE_URL:?set DATABASE_URL (postgres://…)}"
: "${REDIS_URL:?set REDIS_URL (redis://…)}"
: "${SECRET_KEY:?set SECRET_KEY (the same for every process)}"
export AGENTRUN_TASK_BACKEND=${AGENTRUN_TASK_BACKEND:-django_tasks_db.DatabaseBackend}
export AGENTRUN_EMBEDDED_SWEEPER=0  # workers sweep; the web processes need not
# /metrics (docs/operations.md): every process counts into this directory, which the supervisor empties
# at start; any web process's /metrics then answers for all of them (set AGENTRUN_METRICS_TOKEN to open it).
export PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-${AGENTRUN_DATA_DIR:-var}/prometheus}

"$PY" manage.py migrate --noinput
"$PY" manage.py check --deploy --fail-level WARNING

py=$(printf '%q' "$PY")
processes=()
for i in $(seq 0 $((WEB - 1))); do
  processes+=(--process "web-$i=$py -m agentrun.server.web -b $BIND -p $((PORT + i)) agentrun.asgi:application")
done
for i in $(seq 1 "$WORKERS"); do
  processes+=(--process "worker-$i=$py manage.py agentrun_worker --interval 1")
done
for i in $(seq 1 "$NOTIFY_WORKERS"); do
  # Webhooks and email: a queue of their own, so a slow receiver never holds a continuation back.
  processes+=(--process "notify-$i=$py manage.py agentrun_worker --queue-name notifications --interval 1")
done
# exec: the supervisor is this script's process, so a SIGTERM sent to the script reaches it.
exec "$PY" -m agentrun.server.supervisor "${processes[@]}"
