"""The transport: the Metrics API as an interface (``backend``), its gRPC servicer (``servicer``),
server options and start-up (``server``, ``health``), the client with the series-id handshake
(``client``) and the conversions between messages and metricsd's own types (``wire``).

Below it: model, selector, maths, codec, proto. It never imports the store, the proxy or anything
that uses it; the store implements the interface from its own side (metricsd/store/api.py).
"""
