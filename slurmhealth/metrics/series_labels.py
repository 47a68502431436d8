"""Which labels a job's series carry: ``[metrics] job_labels`` (docs/metrics.md), the one
place the sidecar's and the epilog's label names and values are made.

Without prometheus_client (the epilog imports this to publish a job's stats).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmhealth.model_records import GPU_LABELS, JOB_LABELS

JOB_LABEL_MODES = ("series", "info")
GPU_INFO = "slurmhealth_job_gpu_info"
GPU_INFO_LABELS = ("job_id", "user", "account", "partition", "qos", "priority", "node", "gpu")


@dataclass(frozen=True)
class SeriesLabels:
    """The label names and values of one job's series, in one ``[metrics] job_labels``
    mode: the one place they are made (docs/metrics.md).

    ``series``: every series carries the job's labels (:data:`GPU_LABELS`, :data:`JOB_LABELS`).
    ``info``: per-GPU and per-port series carry only the node's and the device's labels, so
    a GPU's series outlive its jobs (no new series per job); ``slurmhealth_job_gpu_info``
    (:data:`GPU_INFO_LABELS`, exported in both modes) attributes them, joined
    ``* on (node, gpu) group_left (...)``. Job-level series (``job_info``, events, samples,
    task metrics) are the job's own and keep :data:`JOB_LABELS` in both modes.
    """

    mode: str
    job: tuple[str, ...]  # JOB_LABELS' values

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return GPU_LABELS if self.mode == "series" else ("node", "gpu", "uuid")

    def gpu(self, index: int | str, uuid: str) -> tuple[str, ...]:
        head = self.job if self.mode == "series" else (self.job[3],)
        return (*head, str(index), uuid)

    @property
    def port_names(self) -> tuple[str, ...]:
        return (*JOB_LABELS, "hca", "port") if self.mode == "series" else ("node", "hca", "port")

    def port(self, hca: str, port: int) -> tuple[str, ...]:
        head = self.job if self.mode == "series" else (self.job[3],)
        return (*head, hca, str(port))
