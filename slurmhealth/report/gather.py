"""``slurmhealth report JOBID``, its gathering: everything known about one job, from every
reachable source, as facts for the pure build (:mod:`slurmhealth.report.build`).

Sources, merged per node: the histories the config can reach (the local node's db and,
when ``paths.db`` holds ``{node}``, every node's) and the shared evidence dir's
``<job_id>/<node>/summary.json`` (how a multi-node job is seen from any node). A node's live
history wins over its summary. With neither, Slurm accounting (sacct, the AdminComment
summary) and Prometheus. The result is a frozen :class:`~slurmhealth.report.build.Report`.

Refusals (``slurmhealth.access``): a user may read only their own jobs; root and the admin
group of the root-owned system config any (:class:`PermissionDenied`, exit 4). An unknown
job is a :class:`UsageError` (exit 2).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import re
import time
from dataclasses import replace
from typing import Any, NamedTuple

from slurmhealth import access
from slurmhealth.access import trust
from slurmhealth.config import Config
from slurmhealth.diagnose.engine import diagnose
from slurmhealth.diagnose.facts import Diagnosis, Facts
from slurmhealth.errors import StoreError, UsageError
from slurmhealth.history import read
from slurmhealth.model_records import Job
from slurmhealth.report import accounting
from slurmhealth.report import sources as src
from slurmhealth.report.build import Read, Report, assemble, with_stored_verdict
from slurmhealth.report.incidents import Incident

log = logging.getLogger("slurmhealth.report")
PermissionDenied = access.AccessDenied  # the requester may not read the job (exit 4)

_JOB_ID = re.compile(r"[0-9]+(?:[_+][0-9]+)?")


def _check_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not _JOB_ID.fullmatch(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (e.g. 42, 42_3, 42+1)")
    return job_id


def build_report(
    cfg: Config,
    job_id: str,
    *,
    window_s: float | None = None,
    requester_uid: int | None = None,
    rights: access.Rights | None = None,
    now: float | None = None,
) -> Report:
    """Merge every source about ``job_id`` and diagnose it. ``requester_uid`` None: no check;
    else that user may read it under ``rights`` (from the system config; None: root and
    the owner only).

    Raises :class:`PermissionDenied` (exit 4) or :class:`UsageError` (unknown job, exit 2).
    """
    job_id = _check_id(job_id)
    tampered: dict[str, str] = {}
    summaries = src.summaries(cfg, job_id, tampered)
    job, owner, dbs, unreadable = src.scan(cfg, job_id, summaries)
    try:
        where, private = _searched(cfg, job_id, dbs)
        if job is None and not summaries and not any(d.nodes for d in dbs):
            # a history that cannot be read is an error to name, not a reason to look elsewhere
            asked = accounting.enabled(cfg) and not unreadable
            acct = accounting.read_accounting(job_id) if asked else None
            if acct is None:
                raise _not_found(cfg, job_id, where, private, unreadable, requester_uid, rights)
            ask = _Ask(window_s, requester_uid, rights, now)
            return _accounting_report(cfg, acct, where, ask)
        for path, why in unreadable.items():
            log.warning("history %s cannot be read (%s): the report may miss part of job %s",
                        path, why, job_id)  # fmt: skip
        job = job or Job(job_id=job_id)
        if requester_uid is not None:
            owner = owner if owner is not None else _summary_owner(summaries)
            _check_access(job, owner, requester_uid, rights or access.Rights())
        nodes, sources, evidence = src.read_nodes(cfg, job, dbs, summaries)
        if not job.node_names:
            job = replace(job, node_names=tuple(n.node for n in nodes))
        facts = Facts(job=job, nodes=tuple(nodes))
        diagnoses = diagnose(facts)
        incidents = src.past_incidents(dbs, job_id, facts)
    finally:
        for d in dbs:
            d.db.close()
    read_from = Read(tuple(sources), tuple(evidence), tuple(incidents), tuple(where),
                     _known_incidents(cfg, job_id, facts))  # fmt: skip
    report = _assemble(cfg, facts, diagnoses, read_from, window_s, now)
    return replace(report, unreached=_tampered(tampered)) if tampered else report


def _tampered(tampered: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Each summary the report did not trust, as an unreached source: "tampered"."""
    for path, why in tampered.items():
        log.warning("%s tampered (%s): not used; the node's history is", path, why)
    return tuple((path, f"tampered: {why}; not used") for path, why in tampered.items())


class _Ask(NamedTuple):
    window_s: float | None
    requester_uid: int | None
    rights: access.Rights | None
    now: float | None


def _accounting_report(
    cfg: Config, acct: accounting.AccountingRead, where: list[str], ask: _Ask
) -> Report:
    """The report from Slurm accounting, the stored summary and Prometheus (no node history
    or evidence reached): the access check first, on the owner accounting names."""
    job = accounting.job_facts(acct.job)
    if ask.requester_uid is not None:
        uid = None
        with contextlib.suppress(KeyError):
            uid = pwd.getpwnam(job.user).pw_uid if job.user else None
        _check_access(job, uid, ask.requester_uid, ask.rights or access.Rights())
    accounting.read_details(cfg, acct)
    facts = accounting.facts_from_accounting(acct)
    for source, why in acct.failed.items():
        log.info("job %s: %s not used: %s", job.job_id, source, why)
    sources = tuple(
        (n, source, path) for n in (job.node_names or ("*",)) for source, path in acct.used
    )
    read_from = Read(sources, (), (), (*where, *(p for _s, p in acct.used)))
    read_from = read_from._replace(known_incidents=_known_incidents(cfg, job.job_id, facts))
    report = _assemble(cfg, facts, diagnose(facts), read_from, ask.window_s, ask.now)
    report = replace(report, unreached=tuple(acct.failed.items()))
    return with_stored_verdict(report, acct.summary)


def _searched(cfg: Config, job_id: str, dbs: list[src.OpenHistory]) -> tuple[list[str], bool]:
    """Every path the report looks at, and whether the local history is there but private
    (readable by the admins only)."""
    where = [d.path for d in dbs] or read.history_paths(cfg)
    private = not where and _private(cfg.db_path())
    where = where or [f"{cfg.db_path()} ({'private' if private else 'missing'})"]
    where.append(os.path.join(src.evidence_root(cfg, "*"), job_id))
    return where, private


def _assemble(
    cfg: Config,
    facts: Facts,
    diagnoses: list[Diagnosis],
    read_from: Read,
    window_s: float | None,
    now: float | None,
) -> Report:
    """The pure build of the gathered facts, with the config's straggler ratio and the clock."""
    return assemble(facts, diagnoses, read_from, straggler_ratio=cfg.sidecar.straggler_ratio,
                    window_s=window_s, now=time.time() if now is None else now)  # fmt: skip


def _not_found(
    cfg: Config,
    job_id: str,
    where: list[str],
    private: bool,
    unreadable: dict[str, str],
    requester_uid: int | None,
    rights: access.Rights | None,
) -> Exception:
    """Why nothing about the job could be read: another's (its evidence folder says whose),
    a history private to the admins, a history that failed, or no record at all."""
    rights = rights or access.Rights()
    folder_owner = _folder_owner(cfg, job_id)
    if requester_uid is not None and folder_owner is not None:
        _check_access(Job(job_id=job_id), folder_owner, requester_uid, rights)
    if private:  # a user's view: the history is root:admin, the summaries theirs
        return access.AccessDenied(
            f"no summary of job {job_id} you may read in {where[-1]}, and history "
            f"{cfg.db_path()} is private to {access.who_may(rights)}"
        )
    if unreadable:  # the job may well be in there: say so, not "no record"
        return StoreError("; ".join(f"history {p} cannot be read: {why}"
                                    for p, why in unreadable.items()))  # fmt: skip
    return UsageError(f"no record of job {job_id} in {', '.join(where)} (check the id: "
                      f"`sacct -j {job_id}`)")  # fmt: skip


def _private(path: str) -> bool:
    """Whether ``path``'s folder exists but this process may not look inside."""
    folder = os.path.dirname(path) or "."
    return os.path.isdir(folder) and not os.access(folder, os.X_OK)


def _summary_owner(found: src.Summaries) -> int | None:
    """The job's uid from its summaries: root lets the job's owner read each (an ACL entry
    of its bundle folder; an older bundle's folder was the owner's), so one uid all of
    them name is the job's."""
    uids = {trust.reader_of(os.path.dirname(path)) for path, _data in found.values()}
    return uids.pop() if len(uids) == 1 and None not in uids else None


def _folder_owner(cfg: Config, job_id: str) -> int | None:
    """The uid root lets read the job's evidence folder (traversable, not listable, by
    anyone; its ACL is readable by anyone who can look it up)."""
    for path in glob.glob(os.path.join(src.evidence_root(cfg, "*"), job_id)):
        uid = trust.reader_of(path)
        if uid is not None:
            return uid
    return None


def _check_access(job: Job, owner: int | None, uid: int, rights: access.Rights) -> None:
    """Refuse (exit 4) unless user ``uid`` may read the job owned by ``owner`` (a uid) or,
    when no uid is known, by ``job.user``; no owner known: root and admins only."""
    me = access.current_caller() if uid == os.getuid() else access.caller_for_uid(uid)
    access.check_job(me, rights, job.job_id, *access.job_owner(owner, job.user))


def _known_incidents(cfg: Config, job_id: str, facts: Facts) -> tuple[tuple[str, Incident], ...]:
    """Incidents recorded for this job, and similar ones (same GPU, Xid, node and check)."""
    from slurmhealth.report.incidents import context_of, related

    context: dict[str, set[Any]] = {"nodes": set(), "gpus": set(), "xids": set(), "checks": set()}
    for nf in facts.nodes:
        for key, values in context_of([*nf.findings, *nf.events], nf.node).items():
            context[key] |= values
    return tuple(related(cfg, job_id, context))
