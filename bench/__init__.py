"""The sidecar latency bench harness (see bench/README.md)."""
