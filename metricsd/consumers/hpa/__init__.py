"""Horizontal autoscaling: Kubernetes' HPA rule plus metricsd's schedules, step limit, fallback and alert.

`spec` holds the spec types and their Kubernetes defaults, `parse` reads them from YAML,
`replicas` is the replica calculator for one metric, `normalize` the stabilisation, behaviour
policies and bounds, `schedule` the time-of-day windows, and `algorithm` ties them into one decision.
"""
