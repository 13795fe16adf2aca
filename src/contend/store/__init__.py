"""Stores: the port (``contend.store.port``) and one module per backend.

Backends are imported lazily by :func:`contend.store.registry.open_store` so that a missing
optional driver only matters to the user who asks for that backend.
"""
