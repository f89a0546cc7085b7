"""The core: the Django app that owns agentrun's tables (app label ``agentrun``) and the libraries every
layer above shares — the models, the listing query (``selectors``), the stream fan-out (``fanout``), the
outbox (``outbox``), who may do what (``access``), ids, errors and time. It imports nothing above it:
not the engine, not a surface (``lint-imports`` checks it).
"""
