"""The sidecar's look at the job's NCCL logs while it runs (docs/network.md).

The ranks' ``NCCL_DEBUG=INFO`` files (``[evidence] nccl_globs``) are read from their start
(NCCL logs its network and channels at communicator set-up) every ``POLL_S``, through the
one NCCL reader (:func:`slurmhealth.diagnose.nccl_log.read_facts`), until it says which transport
carries the job's inter-node traffic, or ``GIVE_UP_S`` passed. Sockets on a job of several
nodes become one ``nccl_socket`` event, at once: a warning when the job did not ask for
them, information when it did (``NCCL_IB_DISABLE=1``, ``NCCL_NET=Socket``), so an alert can
fire while the job still runs; the epilog's summary and the report judge the same facts.

The files are the job user's: opened without following a symlink, owned by the job's uid,
``HEAD_BYTES`` of each, at most ``evidence.nccl_max_files``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slurmhealth.model import Severity
from slurmhealth.sidecar.state import Event

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.model_records import Job

log = logging.getLogger("slurmhealth.sidecar")
POLL_S = 30.0
GIVE_UP_S = 1800.0  # a job whose logs say nothing by then: NCCL_DEBUG is not INFO
HEAD_BYTES = 256 * 1024


class NcclWatch:
    """Polls the job's NCCL files; ``observe(now)`` returns the event once, when known."""

    def __init__(self, cfg: Config, job: Job, start: float) -> None:
        self.cfg, self.job = cfg, job
        self.next_poll, self.until = start, start + GIVE_UP_S
        self.done = False
        self.multi_node = "," in job.nodes or "[" in job.nodes

    def observe(self, now: float) -> list[Event]:
        if self.done or now < self.next_poll:
            return []
        self.next_poll = now + POLL_S
        self.done = now >= self.until
        try:
            return self._poll(now)
        except Exception as exc:  # fail open, loudly: the GPUs are still sampled
            log.warning("job %s: NCCL logs not read: %s", self.job.job_id, exc)
            self.done = True
            return []

    def _poll(self, now: float) -> list[Event]:
        from slurmhealth.diagnose.nccl_log import read_facts

        facts = read_facts(line for text in self._texts() for line in text.splitlines())
        if facts.inter_node_transport is None:
            return []
        self.done = True
        if facts.inter_node_transport != "socket" or not (self.multi_node or len(facts.hosts) > 1):
            return []
        choice = facts.user_choice
        why = f"the job set {choice}" if choice else "the job did not ask for it"
        text = f"NCCL carries the job's inter-node traffic over sockets ({why})"
        evidence = {"transport": facts.inter_node_transport, "user_choice": choice,
                    "hosts": len(facts.hosts), "version": facts.version,
                    "lines": list(facts.evidence[:3])}  # fmt: skip
        severity = Severity.INFO if choice else Severity.WARN
        return [Event(now, "nccl_socket", severity, text, evidence=evidence)]

    def _texts(self) -> list[str]:
        from slurmhealth.evidence.user_files import read_heads

        ev = self.cfg.evidence
        heads = read_heads(ev.nccl_globs, self.job, ev.nccl_max_files, HEAD_BYTES)
        return [data.decode("utf-8", "replace") for data in heads if data]
