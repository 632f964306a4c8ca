"""The node agent side of metricsd: what produces samples and how they are batched for Write."""
