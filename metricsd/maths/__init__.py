"""Pure maths shared by the store, the proxy and the clients: slot hashing, per-series window
reductions, mergeable partials across series, and the aggregate question as plain data.

Nothing here does I/O or imports any other metricsd package but ``model`` and ``selector``.
"""
