"""Evidence taken while a job runs: when the sidecar sees a hang, the bundle (py-spy stacks
of the job's processes above all) is captured before anyone cancels the job."""

from __future__ import annotations

import logging
import threading
import time

from slurmhealth.config import Config
from slurmhealth.model_records import Job

log = logging.getLogger("slurmhealth.sidecar")


def capture_in_background(
    cfg: Config, labels: Job, node: str, gpus: tuple[int, ...], kinds: str
) -> threading.Thread:
    """Start the capture for ``kinds`` (``hang``, ``step_stall``) in a daemon thread."""

    def run() -> None:
        import pwd

        from slurmhealth.evidence.capture import capture
        from slurmhealth.sidecar.procs import job_pids

        try:
            uid = pwd.getpwnam(labels.user).pw_uid if labels.user else None
        except KeyError:
            uid = None
        try:
            result = capture(
                cfg,
                labels.job_id,
                node,
                reason=f"{kinds} detected while the job ran",
                gpus=gpus,
                user=labels.user,
                uid=uid,
                end_ts=time.time(),
                pids=job_pids(labels.job_id),
                budget_s=cfg.evidence.budget_s,
            )
            log.warning("job %s: %s: evidence captured in %s", labels.job_id, kinds, result.dir)
        except Exception as exc:
            log.warning("job %s: evidence capture failed: %s", labels.job_id, exc)

    thread = threading.Thread(target=run, daemon=True, name="capture")
    thread.start()
    return thread
