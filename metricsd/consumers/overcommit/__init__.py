"""Overcommit and reclaim advice: request sizes from weekly peaks, per-node borrowable capacity, and
an hour-of-day table of what the cluster can lend (see `advisor`)."""
