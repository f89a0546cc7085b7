"""Django settings for agentrun, configured from the environment.

The embedded default (no variables set) is SQLite + an in-memory channel layer + in-process tasks.
Production sets DATABASE_URL (PostgreSQL), REDIS_URL and SECRET_KEY, and runs `manage.py agentrun_worker`
(tasks and the sweep: expiry, stalled runs, timeouts, the outbox; `--queue-name notifications` for webhooks
and email), as scripts/production.sh does.
"""

from __future__ import annotations

import json
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("AGENTRUN_DATA_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DEBUG", False)


def private_data_dir() -> Path:
    """The data dir, readable by this user only (0700): it holds the secret key, the audit signing key
    and the embedded database. Tightened at every start, in case it was made more open."""
    DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    if DATA_DIR.stat().st_uid == os.getuid():
        DATA_DIR.chmod(0o700)
    return DATA_DIR


def private_file(path: Path) -> Path:
    """``path`` created if missing, and readable and writable by this user only (0600)."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    if path.stat().st_uid == os.getuid():
        path.chmod(0o600)
    return path


def _secret_key() -> str:
    if key := os.environ.get("SECRET_KEY"):
        return key
    # No key given: a random one made on first start and kept in the data dir (never in the repository).
    # Fine for one machine; several machines must share SECRET_KEY through the environment.
    path = private_file(private_data_dir() / "secret_key")
    if not path.read_text().strip():
        path.write_text(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Former keys, still accepted for signatures (sessions, signed links) and stored secrets while rotating.
SECRET_KEY_FALLBACKS = [k.strip() for k in os.environ.get("SECRET_KEY_FALLBACKS", "").split(",") if k.strip()]
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "django_tasks_db",
    "axes",
    "agentrun.core",  # the tables (app label "agentrun")
    "agentrun",  # the admin, management commands, configured agents
    "approvals",
    "notifications",
]

MIDDLEWARE = [
    # First: times the whole request, tags its log lines, echoes X-Request-ID (docs/operations.md).
    "agentrun.server.observability.RequestObservation",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, so it sees a view's error first: the database or Redis away answers 503, not 500.
    "agentrun.server.unavailable.OutageMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lock-out page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "agentrun.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
ASGI_APPLICATION = "agentrun.asgi.application"

# --- database -------------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'agentrun.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _sqlite_file = Path(DATABASES["default"]["NAME"])
    if _sqlite_file.parent == DATA_DIR:
        private_data_dir()
    _sqlite_file.parent.mkdir(parents=True, exist_ok=True)
    if str(_sqlite_file) != ":memory:":
        # 0600 before SQLite opens it (its -wal and -shm files take the database file's mode).
        private_file(_sqlite_file)
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE: writers take the lock when the transaction starts, so two deciders serialise
        # instead of deadlocking on a read-lock upgrade. WAL lets readers run beside the writer.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests use a file too: several threads (sync_to_async) share it like several processes would.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test-agentrun.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # psycopg's connection pool, one per process: a request borrows a connection and gives it back
    # (conn_max_age stays 0, as the pool requires) instead of opening one per request (8-16 ms each).
    # AGENTRUN_DB_POOL_MAX bounds this process's connections (its threads wait for one, at most
    # AGENTRUN_DB_POOL_TIMEOUT seconds); 0 turns the pool off. A thread holds its connection until its
    # request (or task) ends, so the maximum is also how many threads of a process reach the database at
    # once. Size it so that every process's maximum together stays under the server's max_connections
    # (idle connections beyond AGENTRUN_DB_POOL_MIN close after ten minutes).
    _pool_max = int(os.environ.get("AGENTRUN_DB_POOL_MAX", "20"))
    if _pool_max > 0:
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(int(os.environ.get("AGENTRUN_DB_POOL_MIN", "2")), _pool_max),
            "max_size": _pool_max,
            # Short: while the database is away, a request waits this long before its 503
            # (docs/operations.md); a restart is ridden out within it (core/outages.tune_database_pool).
            "timeout": float(os.environ.get("AGENTRUN_DB_POOL_TIMEOUT", "5")),
        }
        # A pooled connection may have died since it was last used (the database restarted): check it when
        # it is handed out (an empty query, a round trip) rather than fail the request that gets it.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # The decision cycle's statements (agentrun/core/prepared.py) are bound by the server and prepared on
    # their connection once run this many times: planning them anew each time was a third of the server's
    # share of a cycle (docs/performance.md, "Fifth pass"). The ORM's statements are bound client-side,
    # as Django does by default, and never prepared. Behind PgBouncer in transaction mode (< 1.21, or
    # without max_prepared_statements) set AGENTRUN_DB_PREPARE_THRESHOLD=off.
    _prepare = os.environ.get("AGENTRUN_DB_PREPARE_THRESHOLD", "5").strip().lower()
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
        None if _prepare in {"off", "none", ""} else int(_prepare)
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- channel layer ------------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "agentrun.server.channel_layer.AwakePubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 10_000}}}

# --- tasks --------------------------------------------------------------------------------------
TASKS = {
    "default": {
        # Embedded default: in the server process. Production: "django_tasks_db.DatabaseBackend".
        "BACKEND": os.environ.get("AGENTRUN_TASK_BACKEND", "agentrun.server.tasks_backend.InProcessBackend"),
        # "default": the engine's continuations and background tool calls; "notifications": webhook
        # deliveries and email (production runs a worker of its own for it: a slow receiver never
        # holds a continuation back).
        "QUEUES": ["default", "notifications"],
    }
}

# django-axes first (it refuses a locked-out login before a password is checked), then Django's model
# backend, with a person's permissions read in one query (see agentrun.core.access).
AUTHENTICATION_BACKENDS = ["agentrun.core.access.LoginLockoutBackend", "agentrun.core.access.PermissionBackend"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/approvals/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "agentrun.api.authentication.BearerTokenAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # One error envelope for every API error (docs/api.md#errors).
    "EXCEPTION_HANDLER": "agentrun.api.exceptions.exception_handler",
    # API use per person (token or session) and per anonymous address: docs/security.md, "Throttling".
    "DEFAULT_THROTTLE_CLASSES": ["agentrun.api.throttling.ApiRateThrottle"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "agentrun API",
    "DESCRIPTION": "Agent runs that suspend for people: list, approve, decline, resume, audit.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    "PREPROCESSING_HOOKS": ["agentrun.api.schema.drop_slash_aliases"],
    # One name per choice set: without it drf-spectacular names colliding fields ("object", "type",
    # "events") by hash (ObjectF31Enum) and warns (drf_spectacular.W001), which fails
    # `check --deploy --fail-level WARNING` in scripts/production.sh.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "agentrun.core.models.Run.Status",
        "StepStatusEnum": "agentrun.core.models.RunStep.Status",
        "StepTypeEnum": "agentrun.core.models.RunStep.Type",
        "BackgroundTaskStatusEnum": "agentrun.api.views.BACKGROUND_TASK_STATUSES",
        "EventTypeEnum": "agentrun.core.outbox.EVENT_TYPES",
        "DeliveryStatusEnum": "notifications.models.WebhookDelivery.Status",  # Slack's deliveries' too
        "ListObjectEnum": ["list"],
        "RunObjectEnum": ["thread.run"],
        "StepObjectEnum": ["thread.run.step"],
        "MessageObjectEnum": ["thread.message"],
        "BackgroundTaskObjectEnum": ["background_task"],
    },
}

# --- agentrun -----------------------------------------------------------------------------------
AGENTRUN_MODEL = os.environ.get("AGENTRUN_MODEL", "directive")
AGENTRUN_DEMO_AGENTS = env_bool("AGENTRUN_DEMO_AGENTS", True)
# Extra agents: dotted paths to Agent instances (or modules that register agents on import).
AGENTRUN_AGENTS = [p.strip() for p in os.environ.get("AGENTRUN_AGENTS", "").split(",") if p.strip()]
_ttl = os.environ.get("AGENTRUN_SUSPENDED_RUN_TTL", "").strip()
AGENTRUN_SUSPENDED_RUN_TTL = float(_ttl) if _ttl else None
AGENTRUN_MAX_STEPS = int(os.environ.get("AGENTRUN_MAX_STEPS", "10"))


def _agent_reviewers() -> dict[str, list[str]]:
    raw = os.environ.get("AGENTRUN_AGENT_REVIEWERS", "").strip()
    if not raw:
        return {}
    from django.core.exceptions import ImproperlyConfigured

    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"AGENTRUN_AGENT_REVIEWERS is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured("AGENTRUN_AGENT_REVIEWERS must map agent ids to lists of group names")
    mapping = {}
    for agent_id, groups in value.items():
        groups = [groups] if isinstance(groups, str) else groups
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise ImproperlyConfigured(f"AGENTRUN_AGENT_REVIEWERS[{agent_id!r}] must be a list of group names")
        mapping[agent_id] = groups
    return mapping


# Per-agent reviewers: agent id → the groups that may see and decide its runs and calls (superusers
# always may). Agents not named are open to anyone with the global permission. See agentrun.core.access.
AGENTRUN_AGENT_REVIEWERS = _agent_reviewers()
# Separation of duties (docs/api.md#approvals): 0 = the person who started a run may not approve its
# calls. Default 1 (allowed): a single reviewer, and the demo, start and approve their own runs; a team
# with a four-eyes rule sets 0 (and approvals_required=2 on the tools that need it).
AGENTRUN_SELF_APPROVAL = env_bool("AGENTRUN_SELF_APPROVAL", True)
# Shared work (docs/dashboard.md#shared-work): a reviewer's claim on a call lapses after this many
# seconds without the claimer touching the call (default 15 minutes).
AGENTRUN_CLAIM_IDLE_SECONDS = float(os.environ.get("AGENTRUN_CLAIM_IDLE_SECONDS", "900"))


def _review_routes() -> dict[str, dict[str, str]]:
    raw = os.environ.get("AGENTRUN_REVIEW_ROUTES", "").strip()
    if not raw:
        return {"tools": {}, "agents": {}}
    from django.core.exceptions import ImproperlyConfigured

    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"AGENTRUN_REVIEW_ROUTES is not JSON: {exc}") from None
    routes: dict[str, dict[str, str]] = {"tools": {}, "agents": {}}
    if not isinstance(value, dict) or set(value) - set(routes):
        raise ImproperlyConfigured('AGENTRUN_REVIEW_ROUTES must be {"tools": {name: group}, "agents": {id: group}}')
    for kind, mapping in value.items():
        if not isinstance(mapping, dict) or not all(isinstance(g, str) and g for g in mapping.values()):
            raise ImproperlyConfigured(f"AGENTRUN_REVIEW_ROUTES[{kind!r}] must map names to group names")
        routes[kind] = dict(mapping)
    return routes


# Reviewer routing (docs/dashboard.md#shared-work): the group a tool's (or else an agent's) calls are
# assigned to when they open; that group's members are emailed first.
AGENTRUN_REVIEW_ROUTES = _review_routes()
# How long the other reviewers' emails wait behind a routed group's (seconds; the call may be decided by then).
AGENTRUN_ROUTE_HEAD_START_SECONDS = float(os.environ.get("AGENTRUN_ROUTE_HEAD_START_SECONDS", "600"))
# Standing grants expire: 30 days unless the grant says less, never more than this many days.
AGENTRUN_GRANT_MAX_DAYS = float(os.environ.get("AGENTRUN_GRANT_MAX_DAYS", "90"))

# Logs (docs/operations.md "Logs"): AGENTRUN_LOG_FORMAT=json writes one JSON object a line, every logger's
# (Django's and the libraries' too), with the request id, agent, run and tool call the line is about.
AGENTRUN_LOG_FORMAT = os.environ.get("AGENTRUN_LOG_FORMAT", "text").strip().lower()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "agentrun.core.logcontext.ContextFilter"}},
    "formatters": {"json": {"()": "agentrun.core.logcontext.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["context"],
            **({"formatter": "json"} if AGENTRUN_LOG_FORMAT == "json" else {}),
        }
    },
    "loggers": {"agentrun": {"handlers": ["console"], "level": os.environ.get("AGENTRUN_LOG_LEVEL", "INFO")}},
}
if AGENTRUN_LOG_FORMAT == "json":
    # Every other logger too, through the same handler (agentrun's lines are not passed on twice).
    LOGGING["root"] = {"handlers": ["console"], "level": "WARNING"}
    LOGGING["loggers"]["agentrun"]["propagate"] = False
    LOGGING["loggers"]["django"] = {"handlers": ["console"], "level": "INFO", "propagate": False}


def _retain(name: str, default: float | None, unit: float) -> float | None:
    """A retention in seconds from ``name`` (a number of days or hours; "keep": forever)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None if default is None else default * unit
    if raw == "keep":
        return None
    from django.core.exceptions import ImproperlyConfigured

    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f'{name} must be a number or "keep", not {raw!r}') from None
    if value < 0:
        raise ImproperlyConfigured(f"{name} must not be negative")
    return value * unit


DAY, HOUR = 86400.0, 3600.0
# Retention (docs/operations.md "Retention"; agentrun.core.retention): how long each kind of record is
# kept, in seconds (None: forever). Decisions, messages, steps and runs are never pruned.
AGENTRUN_RETENTION = {
    "events": _retain("AGENTRUN_RETAIN_EVENTS_DAYS", 30, DAY),  # handled outbox events
    "deliveries": _retain("AGENTRUN_RETAIN_DELIVERIES_DAYS", 30, DAY),  # finished webhook deliveries
    "notices": _retain("AGENTRUN_RETAIN_NOTICES_DAYS", 30, DAY),  # sent email notices
    "idempotency_keys": _retain("AGENTRUN_RETAIN_IDEMPOTENCY_HOURS", 24, HOUR),
    "heartbeats": _retain("AGENTRUN_RETAIN_HEARTBEATS_DAYS", 1, DAY),  # of processes gone that long
    "task_results": _retain("AGENTRUN_RETAIN_TASKS_DAYS", 7, DAY),  # finished tasks (database backend)
    "chunk_logs": _retain("AGENTRUN_RETAIN_CHUNKS_DAYS", None, DAY),  # of runs final that long; kept by default
}
# The sweep prunes a batch of each kind every AGENTRUN_PRUNE_SECONDS (at once again while one was full).
AGENTRUN_PRUNE_SECONDS = float(os.environ.get("AGENTRUN_PRUNE_SECONDS", "60"))
AGENTRUN_PRUNE_BATCH = int(os.environ.get("AGENTRUN_PRUNE_BATCH", "1000"))

# GET /metrics (docs/operations.md "Metrics"): off (404) unless this is set; then it needs
# "Authorization: Bearer <this token>". PROMETHEUS_MULTIPROC_DIR (set by scripts/production.sh) makes
# every process of the machine count into one directory, so each scrape sees them all once.
AGENTRUN_METRICS_TOKEN = os.environ.get("AGENTRUN_METRICS_TOKEN", "")
# Background tasks: how many run at once (all agents; an Agent may set a lower limit of its own).
AGENTRUN_BACKGROUND_CONCURRENCY = int(os.environ.get("AGENTRUN_BACKGROUND_CONCURRENCY", "8"))
# Seconds without a heartbeat after which a running background task or a run's lease is taken over.
AGENTRUN_LEASE_SECONDS = float(os.environ.get("AGENTRUN_LEASE_SECONDS", "30"))
AGENTRUN_SWEEP_SECONDS = float(os.environ.get("AGENTRUN_SWEEP_SECONDS", "5"))
# SIGTERM: how long a web process lets requests in flight finish (websockets are closed with 1001 at
# once), and a worker its task in progress, before leaving (agentrun.server.web, agentrun_worker).
AGENTRUN_DRAIN_SECONDS = float(os.environ.get("AGENTRUN_DRAIN_SECONDS", "10"))
# ws/runs: a subscriber with more live chunks than this waiting for it because its client does not read
# (its connection stayed full for fanout.CLIENT_STALL_SECONDS) is closed with 4008 "resume after=<seq>"
# and reconnects with ?after=<seq> (docs/api.md "ws/runs").
AGENTRUN_WS_MAX_LAG = int(os.environ.get("AGENTRUN_WS_MAX_LAG", "2000"))
# The server process sweeps too (expiry, stalled runs, lost background tasks); workers always do.
AGENTRUN_EMBEDDED_SWEEPER = env_bool("AGENTRUN_EMBEDDED_SWEEPER", True)

# --- throttling (docs/security.md, "Throttling") ----------------------------------------------------
# Counters live in Django's cache: Redis when REDIS_URL is set (every process counts together), else
# this process's memory (the embedded default is one process).
if REDIS_URL:
    # Counters belong to the users of one database: two deployments on one Redis do not mix them.
    CACHES = {
        "default": {
            # Django's RedisCache with one connection pool per process, not one per request.
            "BACKEND": "agentrun.core.throttle.SharedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"agentrun:{DATABASES['default']['NAME']}",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# How many proxies in front of the web processes append to X-Forwarded-For (0: none; REMOTE_ADDR is the
# client). The client address every per-address limit keys on (agentrun.core.throttle.client_address).
AGENTRUN_TRUSTED_PROXIES = int(os.environ.get("AGENTRUN_TRUSTED_PROXIES", "0"))
# Failed token authentications (REST and websockets) per client address, checked before the token.
AGENTRUN_TOKEN_FAILURE_RATE = os.environ.get("AGENTRUN_TOKEN_FAILURE_RATE", "30/minute")
# How long a process keeps a token's user, a person's permissions and groups (agentrun.core.authcache):
# a change takes effect at once in the process that makes it, within this many seconds in the others. 0: off.
AGENTRUN_AUTH_CACHE_SECONDS = float(os.environ.get("AGENTRUN_AUTH_CACHE_SECONDS", "5"))
# REST use per person (token or session), and per address for anonymous requests; "off" turns one off.
AGENTRUN_API_RATE = os.environ.get("AGENTRUN_API_RATE", "6000/minute")
AGENTRUN_API_ANON_RATE = os.environ.get("AGENTRUN_API_ANON_RATE", "300/minute")
# Open websockets per person, per web process; beyond it a socket is closed with 4029.
AGENTRUN_WS_MAX_PER_USER = int(os.environ.get("AGENTRUN_WS_MAX_PER_USER", "50"))
# Failed logins (django-axes, kept in the database): this many failures lock the account, and the address,
# for AGENTRUN_LOGIN_LOCKOUT_SECONDS (a failure during the lock-out starts it again). A success resets.
AXES_FAILURE_LIMIT = int(os.environ.get("AGENTRUN_LOGIN_FAILURE_LIMIT", "10"))
AXES_COOLOFF_TIME = timedelta(seconds=float(os.environ.get("AGENTRUN_LOGIN_LOCKOUT_SECONDS", "900")))
AXES_LOCKOUT_PARAMETERS = ["ip_address", "username"]  # either one locks
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # failures are kept; successful logins are not logged in a table
AXES_CLIENT_IP_CALLABLE = "agentrun.core.throttle.axes_client_address"
AXES_LOCKOUT_CALLABLE = "approvals.accounts.locked_out"

# --- audit receipts (docs/security.md, "Audit receipts") -----------------------------------------------
# The Ed25519 key that signs each decision's receipt: PEM, or base64 of its 32-byte seed; or a file
# holding either. Neither: one is generated in the data directory (audit_signing_key). Never in the database.
AGENTRUN_AUDIT_SIGNING_KEY = os.environ.get("AGENTRUN_AUDIT_SIGNING_KEY", "")
AGENTRUN_AUDIT_SIGNING_KEY_FILE = os.environ.get("AGENTRUN_AUDIT_SIGNING_KEY_FILE", "")
# Former signing keys' public keys (base64 or PEM, or files), comma-separated: receipts they signed still verify.
AGENTRUN_AUDIT_PUBLIC_KEYS = [
    k.strip() for k in os.environ.get("AGENTRUN_AUDIT_PUBLIC_KEYS", "").split(",") if k.strip()
]

# The admin's decision list verifies the whole chain on each load up to this many receipts (each row's
# receipt always); past it, `manage.py agentrun_audit verify` does.
AGENTRUN_AUDIT_ADMIN_VERIFY_MAX = int(os.environ.get("AGENTRUN_AUDIT_ADMIN_VERIFY_MAX", "5000"))

# --- production behind TLS (AGENTRUN_HTTPS=1): secure cookies, HTTPS redirect, HSTS ------------
if env_bool("AGENTRUN_HTTPS", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("AGENTRUN_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("AGENTRUN_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    # Health checks come over plain HTTP from the load balancer.
    SECURE_REDIRECT_EXEMPT = [r"^healthz/?$", r"^readyz/?$", r"^metrics$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (Django's own, django.middleware.csp): scripts, styles and
# everything else from this origin only, no inline script, no eval; websockets to this origin. The pages
# load htmx and approvals.js as files; the API docs page relaxes styles (agentrun.api.schema).
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
SESSION_COOKIE_HTTPONLY = True


# --- notifications: email, webhooks, signed links (docs/notifications.md; the notifications app) ---
# Email goes through Django's mailers, configured from the environment variables docs/notifications.md#3-email names
# (Django 6.1 deprecates the EMAIL_* settings themselves in favour of MAILERS).
_EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
_email_options: dict = {}
if _EMAIL_BACKEND.endswith("filebased.EmailBackend"):
    _email_options = {"file_path": os.environ.get("EMAIL_FILE_PATH") or str(DATA_DIR / "emails")}
elif _EMAIL_BACKEND.endswith("smtp.EmailBackend"):
    _email_options = {
        "host": os.environ.get("EMAIL_HOST", "localhost"),
        "port": int(os.environ.get("EMAIL_PORT", "25")),
        "username": os.environ.get("EMAIL_HOST_USER", ""),
        "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
        "use_tls": env_bool("EMAIL_USE_TLS", False),
        "timeout": 10,  # a mail server that hangs holds a notifications task this long at most
    }
MAILERS = {"default": {"BACKEND": _EMAIL_BACKEND, "OPTIONS": _email_options}}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "agentrun <agentrun@localhost>")
# Password reset (/accounts/password_reset/): off unless email is configured (EMAIL_BACKEND names a real
# mailer: SMTP, files), or AGENTRUN_PASSWORD_RESET says otherwise. Requests are limited per address and
# per email address asked about; links are built from AGENTRUN_PUBLIC_URL, never the Host header.
AGENTRUN_PASSWORD_RESET = env_bool(
    "AGENTRUN_PASSWORD_RESET",
    "EMAIL_BACKEND" in os.environ and not _EMAIL_BACKEND.endswith(("console.EmailBackend", "locmem.EmailBackend")),
)
AGENTRUN_PASSWORD_RESET_RATE = os.environ.get("AGENTRUN_PASSWORD_RESET_RATE", "5/hour")
# The base of links in messages (signed decision links, dashboard links, password reset).
AGENTRUN_PUBLIC_URL = os.environ.get("AGENTRUN_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# A signed decision link works once, for this many seconds at most.
AGENTRUN_LINK_MAX_AGE = float(os.environ.get("AGENTRUN_LINK_MAX_AGE", str(24 * 3600)))
# Reviewers who chose the digest get at most one email per this many seconds.
AGENTRUN_DIGEST_SECONDS = float(os.environ.get("AGENTRUN_DIGEST_SECONDS", "3600"))
# Webhooks: a delivery attempt gives up after this long; failed attempts are retried after
# RETRY × 2^(n-1) seconds (at most an hour apart), MAX_ATTEMPTS times in all.
AGENTRUN_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("AGENTRUN_WEBHOOK_TIMEOUT_SECONDS", "5"))
AGENTRUN_WEBHOOK_RETRY_SECONDS = float(os.environ.get("AGENTRUN_WEBHOOK_RETRY_SECONDS", "10"))
AGENTRUN_WEBHOOK_MAX_ATTEMPTS = int(os.environ.get("AGENTRUN_WEBHOOK_MAX_ATTEMPTS", "12"))
# Webhooks reach public addresses only; 1 allows loopback and private ones too (receivers on the internal
# network, tests). Link-local (cloud metadata), multicast and reserved addresses stay blocked. See
# notifications.egress and docs/security.md.
AGENTRUN_WEBHOOK_ALLOW_PRIVATE = env_bool("AGENTRUN_WEBHOOK_ALLOW_PRIVATE", False)
# Keys that encrypt stored secrets (webhook signing secrets): comma-separated Fernet keys, newest first;
# unset: derived from SECRET_KEY. Rotation: docs/security.md, "Secrets at rest".
AGENTRUN_ENCRYPTION_KEYS = [k.strip() for k in os.environ.get("AGENTRUN_ENCRYPTION_KEYS", "").split(",") if k.strip()]
# How long a process trusts its in-memory view of who subscribes (endpoints, email recipients)
# before reading it again; changes made in the same process apply at once.
AGENTRUN_EVENTS_REFRESH_SECONDS = float(os.environ.get("AGENTRUN_EVENTS_REFRESH_SECONDS", "5"))
# Slack (docs/slack.md): the app's signing secret (requests to /integrations/slack/… are verified with
# it; unset, every such request is refused), and the base of Slack's Web API (tests point it at a local
# server). A click's response_url is used only on hooks.slack.com or this URL's host.
AGENTRUN_SLACK_SIGNING_SECRET = os.environ.get("AGENTRUN_SLACK_SIGNING_SECRET", "")
AGENTRUN_SLACK_API_URL = os.environ.get("AGENTRUN_SLACK_API_URL", "https://slack.com/api").rstrip("/")
