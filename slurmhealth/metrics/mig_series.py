"""The sidecar's series per MIG instance of its job: memory used and total, processes,
labelled with the job, the parent GPU and the instance ids (docs/mig.md). They keep the
job's labels in both ``[metrics] job_labels`` modes: the instances of one GPU serve
different jobs, so a join on (node, gpu) could not attribute them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from slurmhealth.model import GpuState
from slurmhealth.model_records import GPU_LABELS

MIG_LABELS = (*GPU_LABELS, "gpu_instance", "compute_instance", "mig_uuid")


def mig_families(gpus: tuple[GpuState, ...], job: tuple[str, ...]) -> Iterator[Metric]:
    """One series per MIG instance of the job (the sidecar keeps only the job's), labelled
    with its parent GPU and its instance ids (docs/mig.md)."""
    if not any(g.mig_devices for g in gpus):
        return
    used = GaugeMetricFamily(
        "slurmhealth_mig_memory_used_bytes", "MIG instance memory used, bytes.", labels=MIG_LABELS
    )
    total = GaugeMetricFamily(
        "slurmhealth_mig_memory_total_bytes", "MIG instance memory, bytes.", labels=MIG_LABELS
    )
    procs = GaugeMetricFamily(
        "slurmhealth_mig_processes", "Compute processes on the MIG instance.", labels=MIG_LABELS
    )
    for g in gpus:
        for m in g.mig_devices or ():
            lv = (*job, str(g.index), g.uuid or "", str(m.gpu_instance_id),
                  str(m.compute_instance_id), m.uuid or "")  # fmt: skip
            for fam, v in ((used, m.memory_used_bytes), (total, m.memory_total_bytes)):
                if v is not None:
                    fam.add_metric(lv, float(v))
            if m.processes is not None:
                procs.add_metric(lv, float(len(m.processes)))
    yield from (used, total, procs)


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily("slurmhealth_" + name, doc, labels=MIG_LABELS)
