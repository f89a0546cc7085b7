"""The websocket surface: the consumers of ``ws/runs`` and ``ws/agents`` and websocket authentication."""
