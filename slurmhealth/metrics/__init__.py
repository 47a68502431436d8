"""Prometheus' side of slurmhealth: the series the sidecars and the node build
(``job_series``, ``node``, ``final_series``, ``mig_series``, ``series_labels``), their text
exposition and HTTP serving (``exposition``, ``http_server``, ``web_config``), the sidecars'
state files the node's exporter merges (``export_state``), and the client of Prometheus'
query API the report reads with (``prom_client``). Nothing is imported here: a reader of the
query API never loads ``prometheus_client``."""
