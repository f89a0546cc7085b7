"""Process infrastructure: the production web server (daphne with agentrun's websocket handling), the
supervisor, the channel layer and task backend the settings name, and ``/healthz``."""
