"""The per-job sidecar: samples the job's GPUs, exports them for Prometheus with the job's
labels, and turns what it sees into events (detectors)."""
