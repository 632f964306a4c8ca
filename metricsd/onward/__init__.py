"""Data out of metricsd: remote write to other systems (tee, buffer, sender), and hourly Parquet.

Byte layouts: metricsd/onward/FORMAT.md.
"""
