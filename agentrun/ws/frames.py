"""The ASGI extension by which ``ws/runs`` hands the server websocket frames already made.

``agentrun.server.web`` announces it in a websocket's scope (``scope["extensions"]``) and takes a message
``{"type": FRAMES, "frames": <bytes>}``: whole text frames, one after the other, written to the connection
as they are. Each chunk's frame is made once per process and the same bytes go to every socket
(docs/performance.md "Fan-out (third pass)"). Under another server the consumer sends text as usual.

The extension's entry also gives ``CLIENT_FULL``: a function that says whether the client has stopped
reading (the connection's send queue in the kernel is full of what it was sent and did not read), so
that ``ws/runs`` closes 4008 a client that is behind, never one that waited for a busy process
(docs/performance.md "Fan-out (third pass)", "Fourth pass").
"""

FRAMES = "agentrun.websocket.frames"
CLIENT_FULL = "client_full"
