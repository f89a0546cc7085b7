"""What the tests share, in one place (no test module imports another test module or a conftest).

- ``users``: people in the contract's groups, their tokens and API clients (fixtures ``reviewer``,
  ``viewer``, ``api``, ``viewer_api``, ``auth_header``).
- ``runs``: runs made the way a user makes them (through the engine) and waits for them to rest.
- ``decisions``: a decision through the decision service, or its transaction alone.
- ``waiting``: ``wait_until`` (a condition, never a sleep) and the in-process task backend going idle.
- ``asgi``: an HTTP client over the real ASGI application, websocket communicators, SSE frames.
- ``notifications``: a real HTTP receiver for webhooks, endpoints, the email outbox.
- ``principals``: the security matrix's people and agents.
- ``schema``: the OpenAPI schema schemathesis fuzzes, and its checks.
- ``system`` / ``cluster``: real processes (servers, workers, private PostgreSQL and Redis) and their clients.

Fixtures are registered for the whole suite by ``tests/conftest.py`` (``pytest_plugins``).
"""
