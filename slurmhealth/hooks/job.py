"""The job a prolog/epilog runs for: read from Slurm's environment, completed by one
``squeue`` call on Slurm versions that leave account, QOS or priority out of it."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace

from slurmhealth.errors import UsageError
from slurmhealth.model import parse_gpu_list
from slurmhealth.model_records import Job
from slurmhealth.slurm import SlurmBackend, SlurmError

log = logging.getLogger("slurmhealth.hooks")


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """Slurm's ``SLURM*`` variables as text every later step can store and print.

    Python decodes the environment with ``surrogateescape``, so a value with bytes that are
    not UTF-8 (a partition, job name or comment the job's user chose) carries lone
    surrogates that break the first ``.encode()`` (the prolog died of UnicodeEncodeError
    before). Such a value keeps its valid text and shows each bad byte as U+FFFD; a NUL or
    an over-long value (64 KiB) is cut there. One warning names the variables changed."""
    out: dict[str, str] = {}
    changed = []
    for key, value in env.items():
        if key.startswith("SLURM"):
            raw = value.encode("utf-8", "surrogateescape")[: 64 << 10].split(b"\0")[0]
            text = raw.decode("utf-8", "replace")
            if text != value:
                changed.append(key.encode("utf-8", "replace").decode("utf-8", "replace"))
            value = text
        out[key] = value
    if changed:
        log.warning("environment: %s not valid UTF-8 (or over-long): bad bytes shown as U+FFFD",
                    ", ".join(sorted(changed)))  # fmt: skip
    return out


def job_from_env(env: Mapping[str, str], node: str) -> Job:
    """The job from Slurm's environment, every value decoded defensively (:func:`clean_env`)."""
    env = clean_env(env)
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        raise UsageError("SLURM_JOB_ID is not set: run this from Slurm's Prolog/Epilog")
    uid = env.get("SLURM_JOB_UID", "")
    prio = env.get("SLURM_JOB_PRIORITY", "")
    return Job(
        job_id=job_id,
        node=env.get("SLURMD_NODENAME") or node,
        user=env.get("SLURM_JOB_USER", ""),
        uid=int(uid) if uid.isdigit() else None,
        account=env.get("SLURM_JOB_ACCOUNT", ""),
        partition=env.get("SLURM_JOB_PARTITION", ""),
        qos=env.get("SLURM_JOB_QOS", ""),
        priority=int(prio) if prio.isdigit() else None,
        nodes=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", ""),
        gpus=parse_gpu_list(_indices(env.get("SLURM_JOB_GPUS", ""))),
        comment=env.get("SLURM_JOB_COMMENT", ""),
        extra=env.get("SLURM_JOB_EXTRA", ""),
        exit_code=env.get("SLURM_JOB_EXIT_CODE2") or None,
        mig=_mig_uuids(env),
    )


def _indices(text: str) -> str:
    """``SLURM_JOB_GPUS`` without the MIG UUIDs some setups list in it."""
    return ",".join(t for t in text.split(",") if not t.strip().upper().startswith("MIG-"))


def _mig_uuids(env: Mapping[str, str]) -> tuple[str, ...]:
    """MIG device UUIDs (``MIG-<uuid>``) named in ``SLURM_JOB_GPUS`` or, where the hook sees
    it, ``CUDA_VISIBLE_DEVICES`` (Slurm sets it to MIG UUIDs for MIG GRES): bounded, and
    anything but ``MIG-`` plus a UUID's characters is left out."""
    out: list[str] = []
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        for token in env.get(var, "")[:8192].split(","):
            t = token.strip()
            if t.upper().startswith("MIG-") and len(t) <= 64 and _MIG_CHARS.issuperset(t[4:]):
                out.append("MIG-" + t[4:].lower())
    return tuple(dict.fromkeys(out))[:64]


_MIG_CHARS = frozenset("0123456789abcdefABCDEF-/")


def complete(job: Job, slurm: SlurmBackend, env: Mapping[str, str]) -> Job:
    """Fill account/QOS/priority/comment with one ``squeue`` call when the environment
    lacks them (Slurm < 23.02 passes none of them to the prolog). A Slurm that passes the
    account and the comment or extra (the opt-out token), or its start time (24.11 passes
    comment and extra when set), needs no call: priority alone is not worth one."""
    if "SLURM_JOB_ACCOUNT" in env and any(
        key in env for key in ("SLURM_JOB_COMMENT", "SLURM_JOB_EXTRA", "SLURM_JOB_START_TIME")
    ):
        return job
    t0 = time.monotonic()
    try:
        info = slurm.job(job.job_id)
    except SlurmError as exc:
        log.warning("job %s: cannot read the job record: %s", job.job_id, exc)
        return job
    log.debug("squeue for job %s took %.3f s", job.job_id, time.monotonic() - t0)
    if info is None:
        return job
    return replace(
        job,
        user=job.user or info.user,
        account=job.account or info.account,
        partition=job.partition or info.partition,
        qos=job.qos or info.qos,
        priority=job.priority if job.priority is not None else info.priority,
        nodes=job.nodes or info.nodes,
        comment=job.comment or info.comment,
    )
