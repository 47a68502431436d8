"""A simulated node that runs the real hooks on a simulated clock, for detection quality.

One :class:`Case` is a scenario (TOML for the simulated NVML), kernel-log records the kernel
writes at given times, and the steps Slurm would run: prolog -> epilog -> next prolog (and
``check`` by hand) at seconds into the scenario. :func:`run_case` runs every step through
``run_hook`` with :class:`Adapters` (a :class:`RecordingSlurm`, the simulated GPU backend, a
history in a directory of its own) or ``check_node``, all on one fake clock, and records
what a site would see: drained or not, the reason, and which GPU each finding blames.
Used by benchmarks/detection_quality.py and tests/unit/test_detection_quality.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmhealth.config import Config, load_config
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import Scenario, load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.history import History
from slurmhealth.hooks.check import check_node
from slurmhealth.hooks.job import job_from_env
from slurmhealth.hooks.prolog import Adapters, run_hook
from slurmhealth.kernel_log import format_kmsg_record
from slurmhealth.model import Finding, Severity, normalize_pci_bus_id
from slurmhealth.slurm import Job, NodeInfo
from tests.support.recording_slurm import RecordingSlurm
from tests.support.sim_config import hook_flags

NODE = "n1"
JOB_S = 3600.0  # the job between the first prolog and the epilog
GAP_S = 5.0  # epilog -> next prolog: the next job starts seconds later
STEPS: tuple[tuple[str, float], ...] = (
    ("prolog", 0.0),
    ("epilog", JOB_S),
    ("prolog", JOB_S + GAP_S),
)
CHECK_MID_JOB: tuple[tuple[str, float], ...] = (
    ("prolog", 0.0),
    ("check", JOB_S / 2),
    ("epilog", JOB_S),
    ("prolog", JOB_S + GAP_S),
)
_LINE_SEQ = 90_000  # our kernel records' kmsg sequence numbers, apart from the simulator's


@dataclass(frozen=True)
class Line:
    """A kernel-log record (one message; newlines inside it stay one record) at ``at``."""

    at: float
    text: str


@dataclass(frozen=True)
class Case:
    """One scenario of the corpus and what a correct verdict is.

    ``expect``: ``drain`` (the node is taken out), ``warn`` (a finding of one of ``checks``
    at warn or worse, and no drain) or ``ok`` (benign: no drain, no failing check).
    ``blame``: the PCI bus ids of the faulty GPUs; empty for a node-level fault, whose
    findings must name no GPU.
    """

    name: str
    klass: str
    preset: str
    expect: str
    scenario: Mapping[str, Any]
    blame: tuple[str, ...] = ()
    lines: tuple[Line, ...] = ()
    steps: tuple[tuple[str, float], ...] = STEPS
    checks: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    job_gpus: tuple[int, ...] = tuple(range(8))  # the GPUs Slurm gives each job

    @property
    def fault(self) -> bool:
        return self.expect != "ok"


@dataclass(frozen=True)
class Step:
    """What one run did: its phase and time, status, drain outcome and findings."""

    phase: str
    t: float
    status: str
    drain_state: str | None
    drain_reason: str | None
    findings: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Outcome:
    case: Case
    steps: tuple[Step, ...]
    verdict: str  # detected | missed | false_drain | wrong_gpu | ok
    detail: str = ""
    drain_reason: str | None = None  # the first drain's
    blamed: tuple[str, ...] = ()  # bus ids its draining findings name ("node": none)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.case.name,
            "class": self.case.klass,
            "preset": self.case.preset,
            "expect": self.case.expect,
            "blame": list(self.case.blame),
            "verdict": self.verdict,
            "detail": self.detail,
            "drained": self.drain_reason is not None,
            "drain_reason": self.drain_reason,
            "blamed": list(self.blamed),
            "steps": [s.__dict__ | {"findings": list(s.findings)} for s in self.steps],
        }


class SimClock:
    """The one wall clock of a simulated node: the GPU backend, the simulated NVML and
    Slurm all read it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bus(text: str) -> str:
    return normalize_pci_bus_id(text)


def gpu_buses(data: Mapping[str, Any], node: str = NODE) -> list[str]:
    """The PCI bus id of each GPU index the scenario ``data`` enumerates."""
    built = Scenario("<corpus>", "corpus", "", data, {}).for_node(node)
    return [bus(str(g["pci_bus_id"])) for g in built.gpus]


def toml_text(data: Mapping[str, Any]) -> str:
    """``data`` (tables, arrays of tables, scalars, lists, inline tables) as TOML."""
    out: list[str] = []
    _table(out, "", data)
    return "\n".join(out) + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def _table(out: list[str], prefix: str, data: Mapping[str, Any]) -> None:
    subtables = {k: v for k, v in data.items() if isinstance(v, dict) and k not in ("set", "rate")}
    arrays = {k: v for k, v in data.items() if k == "faults"}
    for key, value in data.items():
        if key not in subtables and key not in arrays:
            out.append(f"{json.dumps(key)} = {_value(value)}")
    for key, value in subtables.items():
        name = f"{prefix}{json.dumps(key)}"
        out.append(f"[{name}]")
        _table(out, name + ".", value)
    for key, faults in arrays.items():
        for fault in faults:
            out.append(f"[[{prefix}{key}]]")
            _table(out, f"{prefix}{key}.", fault)


def case_config(root: Path, scenario: Path, epoch: float, extra: Mapping[str, Any]) -> Config:
    """The node's configuration: a site that states its GPU count and driver."""
    cfg_file = root / "config.toml"
    cfg_file.write_text("")
    flags = {
        **hook_flags(root, scenario),
        "gpu.sim_epoch": epoch,
        "gpu.snapshot_timeout_s": 1.0,
        "gpu.expected_count": 8,
        "gpu.expected_driver": "550.90.07",
        **extra,
    }
    return load_config(str(cfg_file), env={}, flags=flags)


def _boot_time() -> float:
    """When this machine booted, as the simulator and the kernel-log reader compute it."""
    with open("/proc/uptime", encoding="ascii") as fh:
        return time.time() - float(fh.read().split()[0])


class SimNode:
    """One simulated node: its directory, clock, Slurm, history and kernel log."""

    def __init__(self, root: Path, epoch: float, *, slurm_nodes: int = 10) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.epoch = epoch
        self.clock = SimClock(epoch)
        cluster = [NodeInfo(f"n{i}", "idle") for i in range(1, slurm_nodes + 1)]
        self.slurm = RecordingSlurm(cluster, clock=self.clock)
        self.history = History(root / "history.db", spool_path=root / "spool.jsonl")
        self.kmsg = root / "kmsg"
        self._written = 0
        self._boot = _boot_time()
        self.jobs = 0

    def close(self) -> None:
        self.history.close()

    def known_before(self, cfg: Config) -> None:
        """A node slurmhealth checked before the case begins: its kernel-log position is
        stored (hooks/kernel_read.py), so the case's fault lines are new, not the lines a
        node's very first run only records."""
        from slurmhealth.hooks.kernel_read import read_kernel_log
        from slurmhealth.kernel_log import KernelLogReader

        self.kmsg.touch()
        reader = KernelLogReader(str(self.kmsg), lookback_s=cfg.kernel_log.lookback_s)
        read_kernel_log(reader, None, self.history.path, [])

    def write_kernel(self, lines: Sequence[Line], upto: float) -> None:
        """Append the records of ``lines`` the kernel has written by ``upto`` (in order)."""
        new = [ln for ln in lines[self._written :] if ln.at <= upto]
        if not new:
            return
        with open(self.kmsg, "a", encoding="utf-8") as fh:
            for ln in new:
                seq = int(self.epoch) * 100_000 + _LINE_SEQ + self._written
                usec = max(0, int((self.epoch + ln.at - self._boot) * 1e6))
                fh.write(format_kmsg_record(seq, usec, ln.text) + "\n")
                self._written += 1

    def backend(
        self, scenario: Scenario, cfg: Config, timeout_s: float | None = None
    ) -> NvmlBackend:
        lib = SimulatedNvml(
            scenario, NODE, epoch=self.epoch, kernel_log_path=str(self.kmsg), clock=self.clock
        )
        timeout = cfg.gpu.snapshot_timeout_s if timeout_s is None else timeout_s
        return NvmlBackend(lib, node=NODE, timeout_s=timeout, clock=self.clock)

    def run(
        self, cfg: Config, scenario: Scenario, phase: str, t: float, gpus: Sequence[int]
    ) -> Step:
        """One prolog, epilog or ``check`` at ``t`` seconds into the scenario."""
        self.clock.now = self.epoch + t
        if phase == "check":
            backend = self.backend(scenario, cfg)
            try:
                checked = check_node(cfg, backend, self.history, phase="check")
            finally:
                backend.close()
            return Step(phase, t, checked.status, None, None, _findings(checked.findings))
        if phase == "prolog":
            self.jobs += 1
            job_id = str(1000 + self.jobs)
            self.slurm.jobs[job_id] = Job(job_id, user="alice", account="physics")
        job_id = str(1000 + self.jobs)
        env = {
            "SLURM_JOB_ID": job_id,
            "SLURMD_NODENAME": NODE,
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_GPUS": ",".join(map(str, gpus)),
        }
        if phase == "epilog":
            env["SLURM_JOB_EXIT_CODE2"] = "0:0"
        # the prologs of a burst share one GPU read for 2 s of real time
        # (hooks/snapshot_cache.py); here runs hours apart on the simulated clock come
        # milliseconds apart in real time, so each one reads the GPUs itself
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(cfg.paths.run_dir, "snapshot.json"))
        adapters = Adapters(
            self.slurm, lambda timeout_s: self.backend(scenario, cfg, timeout_s), self.history
        )
        res = run_hook(cfg, job_from_env(env, NODE), env, phase, adapters)
        drain = res.drain
        return Step(
            phase,
            t,
            res.status,
            None if drain is None else drain.state,
            None if drain is None else drain.reason,
            _findings(res.findings),
        )


def _findings(findings: Sequence[Finding]) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "check": f.check,
            "severity": f.severity.label,
            "gpu": f.gpu,
            "pci_bus_id": f.evidence.get("pci_bus_id"),
            "drains": f.failing and f.action.takes_node_out,
            "message": f.message,
        }
        for f in findings
    )


def run_case(case: Case, root: Path, epoch: float) -> Outcome:
    """Run ``case`` in directory ``root`` (created) and judge the result. ``epoch`` (UTC
    seconds) starts the simulated clock; keep it near the real time: the kernel-log
    reader's first read keeps only the last hour by the real clock."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "scenario.toml"
    path.write_text(toml_text(case.scenario))
    cfg = case_config(root, path, epoch, case.config)
    scenario = load_scenario(str(path))
    enumerated = gpu_buses(case.scenario)
    node = SimNode(root, epoch)
    node.known_before(cfg)
    steps: list[Step] = []
    logging.disable(logging.WARNING)  # the hooks' drain warnings are the verdict here
    try:
        for phase, t in case.steps:
            node.write_kernel(case.lines, t)
            step = node.run(cfg, scenario, phase, t, case.job_gpus)
            steps.append(step)
            if step.drain_state == "drained":
                break  # a drained node runs no next job
    finally:
        logging.disable(logging.NOTSET)
        node.close()
    return judge(case, tuple(steps), enumerated)


def blamed(f: Mapping[str, Any], enumerated: Sequence[str]) -> str | None:
    """The bus id of the GPU a finding names (by index or by bus id); None: the node."""
    if f["gpu"] is not None and f["gpu"] < len(enumerated):
        return enumerated[int(f["gpu"])]
    text = f.get("pci_bus_id")
    try:
        return None if not text else bus(str(text))
    except ValueError:
        return None


def judge(case: Case, steps: tuple[Step, ...], enumerated: Sequence[str]) -> Outcome:
    """The verdict on one case, with the first drain's reason and the GPUs it blames."""
    outcome = _verdict(case, steps, enumerated)
    drained = next((s for s in steps if s.drain_state == "drained"), None)
    if drained is None:
        return outcome
    names = {blamed(f, enumerated) or "node" for f in drained.findings if f["drains"]}
    return dataclasses.replace(
        outcome, drain_reason=drained.drain_reason, blamed=tuple(sorted(names))
    )


def _verdict(case: Case, steps: tuple[Step, ...], enumerated: Sequence[str]) -> Outcome:
    """detected / missed / false_drain / wrong_gpu / ok."""
    gpus = set(enumerated) | set(case.blame)
    drained = [s for s in steps if s.drain_state == "drained"]
    alarms = [s for s in steps if s.phase == "check" and s.status == "fail"]
    if not case.fault or case.expect == "warn":
        if drained or alarms:
            where = (drained or alarms)[0]
            return Outcome(case, steps, "false_drain", f"{where.phase}: {where.drain_reason}")
        if not case.fault:
            return Outcome(case, steps, "ok")
        return _judge_warn(case, steps, enumerated)
    if not drained:
        return Outcome(case, steps, "missed", "never drained")
    candidates = [f for f in drained[0].findings if f["drains"]]
    names = {blamed(f, enumerated) for f in candidates}
    names = {n if n in gpus else None for n in names}  # a switch's bus id is the node's
    wanted: set[str | None] = set(case.blame) or {None}
    reason = drained[0].drain_reason or ""
    if not names & wanted or names - wanted - {None}:
        return Outcome(case, steps, "wrong_gpu", f"blamed {sorted(map(str, names))}")
    named = _reason_names(reason, enumerated, case.blame)
    if named - wanted or (case.blame and None in named):
        return Outcome(case, steps, "wrong_gpu", f"reason: {reason}")
    return Outcome(case, steps, "detected", reason)


def _reason_names(reason: str, enumerated: Sequence[str], gone: Sequence[str]) -> set[str | None]:
    """The GPUs a drain reason names (``gpu<i>``, or the bus id of a GPU, enumerated or
    ``gone``); ``{None}``: none."""
    named: set[str | None] = {b for b in (*enumerated, *gone) if b in reason}
    for m in re.finditer(r"\bgpu([0-9]+)\b", reason):
        named.add(enumerated[int(m[1])] if int(m[1]) < len(enumerated) else m[0])
    return named or {None}


def _judge_warn(case: Case, steps: tuple[Step, ...], enumerated: Sequence[str]) -> Outcome:
    reported = [
        f
        for s in steps
        for f in s.findings
        if f["check"] in case.checks and Severity.parse(f["severity"]) >= Severity.WARN
    ]
    if not reported:
        return Outcome(case, steps, "missed", f"no {'/'.join(case.checks)} warning")
    gpus = set(enumerated) | set(case.blame)
    # a bus id that is no GPU's (an HCA's, a switch's) is the node's
    names = {n if (n := blamed(f, enumerated)) in gpus else None for f in reported}
    if names - set(case.blame or [None]):
        return Outcome(case, steps, "wrong_gpu", f"blamed {sorted(map(str, names))}")
    return Outcome(case, steps, "detected", reported[0]["message"])
