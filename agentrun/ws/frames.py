"""The ASGI extension by which ``ws/runs`` hands the server websocket frames already made.

``agentrun.server.web`` announces it in a websocket's scope (``scope["extensions"]``) and takes a message
``{"type": FRAMES, "frames": <bytes>}``: whole text frames, one after the other, written to the connection
as they are. Each chunk's frame is made once per process and the same bytes go to every socket
(docs/performance.md "Fan-out (third pass)"). Under another server the consumer sends text as usual.
"""

FRAMES = "agentrun.websocket.frames"
