"""The trio runtime: processes, workers, pools, and the host that owns them."""
