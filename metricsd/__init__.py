"""metricsd: an in-memory, sharded time-series store for Kubernetes pod metrics."""

__version__ = "0.1.0"
