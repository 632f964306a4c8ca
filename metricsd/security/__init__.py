"""Who may talk to metricsd, and over what: TLS from certificate files (reloaded when they change),
bearer tokens with roles (from a file of hashes, or Kubernetes' TokenReview), and which role each
gRPC method and HTTP route needs.

Pure policy and credential handling only: the gRPC interceptor lives in metricsd/rpc/auth.py, the
HTTP middleware in metricsd/http/auth.py, the flags in metricsd/cmd/security.py.
"""
