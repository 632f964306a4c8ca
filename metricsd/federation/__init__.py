"""Federation: one proxy's API over several clusters' proxies (``metricsd federate``).

- spec.py: the clusters (``--cluster NAME=ADDR`` or a file), checked before anything starts;
- routing.py: which clusters a selector can match (``cluster`` matchers), the request each is
  sent, and the ``cluster="NAME"`` label put on what comes back (pure);
- merge.py: one answer from the clusters' answers, aggregates from their partials (pure);
- calls.py: one call to one cluster under its deadline, with retries and per-cluster health;
- backend.py: the MetricsBackend that fans each request out and names the clusters missing.
"""
