"""The store: per-series head buffers and sealed chunks under a pod-keyed index, with aggregates."""
