"""The built-in consumers: pure autoscaling algorithms (hpa, vpa, overcommit) fed by thin controller loops."""
