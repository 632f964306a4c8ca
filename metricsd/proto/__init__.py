"""Generated gRPC code for proto/metricsd.proto. Regenerate with `make proto`; never edit by hand."""
