"""The data plane: validated requests in, typed results out, for every route (see `plane.py`).

It sits between the HTTP layer (`service.api`) and the runtime: it may import codecs,
runtime, registry, introspection and the leaf, never `service.api`.
"""
