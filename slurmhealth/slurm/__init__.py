"""The Slurm adapter: node state and reason, drain, resume, one job's record.

The default backend runs ``sinfo``/``squeue``/``scontrol`` with argument lists (never a
shell) and parses their one-line output; it works on Slurm 22.05 through 25.x. A pyslurm
backend can stand behind the same interface where pyslurm matches the running Slurm
(PyPI's pyslurm targets Slurm 25.11 only), chosen with ``slurm.backend = "pyslurm"``.

Etiquette (see DESIGN.md section 4): one read per job per node at most on the happy path;
the drain is the only write; a reason someone else set is never overwritten.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence

from slurmhealth.slurm.acct import (
    EVENT_FIELDS,
    SACCT_FIELDS,
    NodeEvent,
    parse_events,
    parse_sacct,
)
from slurmhealth.slurm.base import (
    MAX_HOSTS,
    MAX_REASON,
    REASON_PREFIX,
    HostlistError,
    Job,
    NodeInfo,
    SlurmBackend,
    SlurmError,
    clean_reason,
    expand_hostlist,
    null,
)
from slurmhealth.slurm.batch import (
    BatchJob,
    parse_job_states,
    parse_sbatch,
    parse_topology,
    sbatch_argv,
)

__all__ = [
    "MAX_HOSTS",
    "MAX_REASON",
    "REASON_PREFIX",
    "BatchJob",
    "HostlistError",
    "Job",
    "NodeInfo",
    "SlurmBackend",
    "SlurmCli",
    "SlurmError",
    "clean_reason",
    "expand_hostlist",
    "null",
    "open_slurm",
    "parse_job_line",
    "parse_nodes",
    "parse_show_job",
]


Env = Mapping[str, str] | None


def _parse_time(text: str) -> float | None:
    """sinfo's ``%H`` (``2026-11-30T08:01:02``, local time) as UTC seconds."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


class SlurmCli:
    """Backend over the Slurm command-line tools."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self.calls: list[list[str]] = []  # every command run, for tests and --debug

    def with_timeout(self, timeout_s: float) -> SlurmCli:
        """A copy whose calls wait at most ``timeout_s`` (and no longer than this one's)."""
        bounded = SlurmCli(min(self.timeout_s, timeout_s))
        bounded.calls = self.calls  # one record of every command run
        return bounded

    def _run(
        self, argv: Sequence[str], time_format: str = "standard", extra_env: Env = None
    ) -> str:
        self.calls.append(list(argv))
        env = {**os.environ, **(extra_env or {}), "SLURM_TIME_FORMAT": time_format}
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]} not found: are the Slurm client tools installed?"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer within {self.timeout_s:.2g} s") from None
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            raise SlurmError(
                f"{' '.join(argv[:3])} failed ({proc.returncode}): {err[-1] if err else ''}"
            )
        return proc.stdout

    def nodes(self) -> list[NodeInfo]:
        """Every node once (``sinfo -N`` repeats a node per partition)."""
        return parse_nodes(self._run(["sinfo", "-h", "-N", "-o", SINFO_FORMAT]))

    def drain(self, node: str, reason: str) -> None:
        self._run(
            [
                "scontrol",
                "update",
                f"NodeName={node}",
                "State=DRAIN",
                f"Reason={clean_reason(reason)}",
            ]
        )

    def resume(self, node: str) -> None:
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict (StdOut, StdErr, ExitCode, ...); {} if gone."""
        try:
            return parse_show_job(self._run(["scontrol", "show", "job", "-o", job_id]))
        except SlurmError:
            return {}

    def job(self, job_id: str) -> Job | None:
        """One ``squeue`` call; None when the job is unknown (already gone)."""
        try:
            out = self._run(["squeue", "-h", "-j", job_id, "-o", SQUEUE_FORMAT])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        return parse_job_line(job_id, out)

    def jobs_on_node(self, node: str) -> dict[str, Job]:
        """Every job ``squeue`` lists on ``node``, in one call (the node agent's view, for
        the prologs of all of them); a job listed twice (a comment can hold a newline that
        fakes a line) is left out, so its prolog asks for it alone."""
        return parse_node_jobs(self._run(["squeue", "-h", "-w", node, "-o", NODE_JOBS_FORMAT]))

    # -- accounting (slurmdbd): parsed in slurm_acct.py -------------------------------------

    def accounting_job(self, job_id: str) -> Job | None:
        """The job's record in slurmdbd (``sacct``); None when it has none."""
        argv = ["sacct", "-j", job_id, "-X", "-P", "-n", "-o", ",".join(SACCT_FIELDS)]
        return parse_sacct(job_id, self._run(argv, time_format="%s"))

    def node_events(self, nodes: Sequence[str], start: float, end: float) -> list[NodeEvent]:
        """State changes (drains, downs) of ``nodes`` that overlap ``start``..``end``."""
        fmt = "%Y-%m-%dT%H:%M:%S"  # sacctmgr reads local time
        argv = ["sacctmgr", "-n", "-P", "show", "event", f"nodes={','.join(nodes)}",
                f"start={time.strftime(fmt, time.localtime(start))}",
                f"end={time.strftime(fmt, time.localtime(end))}",
                f"format={','.join(EVENT_FIELDS)}"]  # fmt: skip
        return parse_events(self._run(argv, time_format="%s"), tuple(nodes))

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """Store ``text`` as the job's AdminComment in slurmdbd. From EpilogSlurmctld the job
        is completing and ``scontrol update`` refuses ("Job has already finished");
        ``sacctmgr modify job`` works at once but lowercases the value: ``text`` must be
        case-free."""
        if not re.fullmatch(r"[a-z0-9:._-]{1,8000}", text):
            raise SlurmError("an AdminComment must be 1-8000 of [a-z0-9:._-] (sacctmgr lowercases)")
        self._run(["sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set",
                   f"AdminComment={text}"])  # fmt: skip

    # -- batch jobs (the pairwise sweep): formats here, the orchestration in sweep/ ---------

    def submit(self, job: BatchJob) -> str:
        """``sbatch --parsable ...`` for ``job``; the new job's id. ``job.env`` reaches the
        job through sbatch's default ``--export=ALL`` (values may hold commas)."""
        return parse_sbatch(self._run(sbatch_argv(job), extra_env=job.env))

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        """``{job id: state}`` (``COMPLETED``, ``RUNNING``, ...) of the jobs slurmctld still
        knows, one ``squeue`` call; a job it forgot is left out."""
        if not job_ids:
            return {}
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T"]
        try:
            return parse_job_states(self._run(argv))
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return {}  # every one of them is gone
            raise

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._run(["scancel", *job_ids])

    def leaf_switches(self) -> dict[str, str]:
        """``{node: leaf switch}`` from ``scontrol show topology`` (topology/tree); {} when
        the cluster has no topology or it cannot be read."""
        try:
            return parse_topology(self._run(["scontrol", "show", "topology"]))
        except SlurmError:
            return {}


SINFO_FORMAT = "%N|%T|%H|%u|%E"
SQUEUE_FORMAT = "%u|%a|%P|%q|%Q|%N|%T|%k"  # the comment last: it may hold "|"
NODE_JOBS_FORMAT = "%A|" + SQUEUE_FORMAT  # every job of a node; %A: an array task's own id
# `scontrol show job -o`: one line of Key=Value; values may hold spaces (Comment, paths),
# so the line is split before each " Key=" (a comment may fake one: see parse_show_job)
_KEY = r"[A-Za-z][A-Za-z0-9:/_]*"
_SHOW_KEY = re.compile(r" (?=" + _KEY + "=)")


def parse_nodes(out: str) -> list[NodeInfo]:
    """``sinfo -h -N -o SINFO_FORMAT`` output as one :class:`NodeInfo` per node; lines of
    another shape are skipped. sinfo's "unset" spellings (``none``, ``Unknown``,
    ``(null)``) become empty. The user and time belong to the reason: without one they are
    left empty (24.11 prints the user of a node's last state change, e.g. ``root`` for an
    idle node that registered; 22.05 prints ``Unknown``)."""
    seen: dict[str, NodeInfo] = {}
    for line in out.splitlines():
        parts = line.split("|", 4)
        name = null(parts[0])
        if len(parts) != 5 or not name or name in seen:
            continue
        _, state, when, user, reason = (null(p) for p in parts)
        reason = "" if reason == "none" else reason
        seen[name] = NodeInfo(
            name=name,
            state=state.lower(),
            reason=reason,
            reason_user="" if user == "Unknown" or not reason else user,
            reason_time=_parse_time(when) if reason else None,
        )
    return list(seen.values())


def parse_show_job(out: str) -> dict[str, str]:
    """The first line of ``scontrol show job -o`` as ``{Key: value}``, ``(null)`` made
    empty. A free-text value (the job's comment) can hold text that looks like another
    ``Key=``: a key seen twice is ambiguous and left out, so a job cannot choose the value
    of a field it did not write (e.g. ``StdOut``)."""
    lines = out.strip().splitlines()
    record: dict[str, str] = {}
    twice: set[str] = set()
    for token in _SHOW_KEY.split(lines[0] if lines else ""):
        key, sep, value = token.partition("=")
        if not sep or not re.fullmatch(_KEY, key):
            continue
        if key in record:
            twice.add(key)
        record[key] = null(value)
    return {k: v for k, v in record.items() if k not in twice}


def parse_node_jobs(out: str) -> dict[str, Job]:
    """``squeue -h -w NODE -o NODE_JOBS_FORMAT`` output by job id; lines of another shape
    and job ids listed more than once are left out."""
    found: dict[str, Job | None] = {}
    for line in out.splitlines():
        job_id, sep, rest = line.partition("|")
        if not sep or not re.fullmatch(r"[0-9]{1,12}", job_id):
            continue
        info = parse_job_line(job_id, rest)
        found[job_id] = None if job_id in found else info
    return {k: v for k, v in found.items() if v is not None}


def parse_job_line(job_id: str, out: str) -> Job | None:
    """``squeue -h -j ID -o SQUEUE_FORMAT`` output as a :class:`Job`; None when it is
    not one such line. ``(null)`` (an unset account, QOS, comment) becomes empty."""
    lines = out.strip().splitlines()
    parts = lines[0].split("|", 7) if lines else []
    if len(parts) != 8:
        return None
    user, account, partition, qos, prio, nodes, state, comment = (null(p) for p in parts)
    return Job(
        job_id=job_id,
        user=user,
        account=account,
        partition=partition,
        qos=qos,
        priority=int(prio) if prio.isascii() and prio.isdigit() and len(prio) <= 20 else None,
        nodes=nodes,
        state=state.lower(),
        comment=comment,
    )


def open_slurm(backend: str = "cli", timeout_s: float = 5.0) -> SlurmBackend:
    """The configured backend; ``auto`` takes pyslurm only when it imports and matches."""
    if backend in ("pyslurm", "auto"):
        from slurmhealth.slurm import pyslurm_backend as slurm_pyslurm

        reason = slurm_pyslurm.unavailable()
        if reason is None:
            return slurm_pyslurm.PySlurmBackend()
        if backend == "pyslurm":
            raise SlurmError(f"slurm.backend = pyslurm, but {reason}")
    return SlurmCli(timeout_s)


NO_LOCAL_STEPS = "No job steps exist on this node."


def local_job_ids(node: str, timeout_s: float = 5.0) -> list[str] | None:
    """The jobs with steps on this host's slurmd for ``node`` (``scontrol listpids '*'
    NODE``: the local slurmd answers from its step sockets, slurmctld is not asked), or
    None when that cannot be told (scontrol missing, slow, or erring)."""
    try:
        proc = subprocess.run(
            ["scontrol", "listpids", "*", node],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_listpids(proc.returncode, proc.stdout, proc.stderr)


def parse_listpids(returncode: int, stdout: str, stderr: str) -> list[str] | None:
    """Job ids in ``scontrol listpids`` output (a ``PID JOBID STEPID LOCALID GLOBALID``
    header, then a row per process), in order, once each; [] only for the one answer that
    means no steps (exit 1, "No job steps exist on this node." alone on stderr: an unknown
    node prints an error before that same line); None for anything else."""
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    if returncode != 0:
        return [] if said == [NO_LOCAL_STEPS] else None
    lines = stdout.splitlines()
    if not lines or lines[0].split()[:2] != ["PID", "JOBID"]:
        return None
    jobs = [parts[1] for parts in (line.split() for line in lines[1:]) if len(parts) >= 3]
    if not jobs or not all(re.fullmatch(r"\d+([_+]\d+)?", j) for j in jobs):
        return None
    return list(dict.fromkeys(jobs))


def reboot_node(node: str, reason: str, timeout_s: float = 5.0) -> None:
    """``scontrol reboot ASAP nextstate=RESUME reason=... NODE``: slurmctld drains the node,
    runs its ``RebootProgram`` once no job runs there, and resumes it when it registers
    again within ``ResumeTimeout`` (else the node goes DOWN). Raises :class:`SlurmError`."""
    SlurmCli(timeout_s)._run(
        ["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={clean_reason(reason)}", node]
    )


def node_partitions(timeout_s: float = 5.0) -> dict[str, tuple[str, ...]]:
    """Each node's partitions (``sinfo -h -N -o %N|%R``: a line per node and partition)."""
    out: dict[str, tuple[str, ...]] = {}
    for line in SlurmCli(timeout_s)._run(["sinfo", "-h", "-N", "-o", "%N|%R"]).splitlines():
        node, sep, part = line.strip().partition("|")
        if sep and node:
            out[node] = (*out.get(node, ()), part.strip())
    return out
