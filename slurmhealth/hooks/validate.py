"""``slurmhealth validate``: prove a drained node healthy before it is resumed.

No Slurm job: the health checks (phase ``validate``, all GPUs) and the configured short
benchmarks (``[baseline] validate_commands``; run without a shell, with a timeout), whose
output is parsed, stored with label ``validate`` and compared with the fleet reference
(the other nodes' latest values, or a pinned value). A benchmark whose program is not
installed on the node is skipped with that reason (recorded as an info finding), not failed.
The run is one ``check_runs`` row with phase ``validate`` and status ``ok`` / ``fail``;
``resume`` looks for it. Each step reports its start and end to ``progress`` (the CLI
prints them on stderr), since a benchmark may run up to ``validate_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.baseline.model import ParseResult
from slurmhealth.config import Config
from slurmhealth.errors import UsageError
from slurmhealth.model import Severity

Parse = Callable[[str, str], ParseResult]
Progress = Callable[[str], None]
PHASE = "validate"
LABEL = "validate"


@dataclass(frozen=True)
class BenchOutcome:
    name: str
    command: str
    passed: bool
    stored: int = 0
    problems: tuple[str, ...] = ()  # why it failed (tool errors, exit code, timeout, parse)
    deviations: tuple[dict[str, Any], ...] = ()
    skipped: str = ""  # why it did not run (its program is not installed); not a failure
    seconds: float = 0.0  # wall time of the run

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else ("ok" if self.passed else "fail")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "status": self.status,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 3),
            "passed": self.passed,
            "stored": self.stored,
            "problems": list(self.problems),
            "deviations": list(self.deviations),
        }


@dataclass(frozen=True)
class ValidateResult:
    node: str
    run_id: str
    check_status: str
    check_findings: tuple[str, ...]
    benchmarks: tuple[BenchOutcome, ...] = ()
    reasons: tuple[str, ...] = field(default_factory=tuple)  # why it failed; empty: passed

    @property
    def status(self) -> str:
        return "fail" if self.reasons else "ok"

    @property
    def exit_code(self) -> int:
        return 1 if self.reasons else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "slurmhealth.validate/1",
            "node": self.node,
            "run_id": self.run_id,
            "status": self.status,
            "check_status": self.check_status,
            "check_findings": list(self.check_findings),
            "benchmarks": [b.to_dict() for b in self.benchmarks],
            "reasons": list(self.reasons),
        }


def select_benchmarks(cfg: Config, names: Sequence[str] | None) -> dict[str, str]:
    """The configured commands to run, by name; unknown names are a usage error."""
    commands = {str(k): str(v) for k, v in cfg.baseline.validate_commands.items()}
    if names is None:
        return commands
    unknown = [n for n in names if n not in commands]
    if unknown:
        known = ", ".join(commands) or "none"
        raise UsageError(f"--benchmarks: unknown {', '.join(unknown)} (configured: {known})")
    return {n: commands[n] for n in names}


class _NotInstalled(Exception):
    """The benchmark's program does not exist on this node."""


def _run_command(command: str, timeout_s: float) -> tuple[str, list[str]]:
    """Stdout (plus stderr) of ``command``, and what went wrong running it. Raises
    ``_NotInstalled`` when its program is not found."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return "", [f"bad command line: {exc}"]
    if not argv:
        return "", ["empty command line"]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False,
            errors="replace",
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise _NotInstalled(f"{argv[0]}: command not found") from exc
    except PermissionError:
        return "", [f"{argv[0]}: permission denied"]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return out, [f"timed out after {timeout_s:g} s"]
    problems = [] if proc.returncode == 0 else [f"exited {proc.returncode}"]
    return proc.stdout + ("\n" + proc.stderr if proc.stderr else ""), problems


def _benchmark(
    cfg: Config,
    name: str,
    command: str,
    node: str,
    gpu_model: str | None,
    parse: Parse,
    *,
    label: str = LABEL,
    timeout_s: float | None = None,
) -> BenchOutcome:
    from slurmhealth.baseline import compare, store
    from slurmhealth.baseline.model import BaselineParseError

    timeout = cfg.baseline.validate_timeout_s if timeout_s is None else timeout_s
    try:
        output, problems = _run_command(command, timeout)
    except _NotInstalled as exc:
        return BenchOutcome(name, command, False, skipped=str(exc))
    if problems and not output.strip():  # did not start, or died silently: nothing to parse
        return BenchOutcome(name, command, False, problems=tuple(problems))
    try:
        result = parse(name, output)
    except BaselineParseError as exc:
        return BenchOutcome(name, command, False, problems=(*problems, f"unreadable: {exc}"))
    problems += [f"tool reported: {e}" for e in result.errors]
    if not result.passed and not result.errors:
        problems.append("tool reported errors")
    stored = store.ingest(
        cfg, name, result, node=node, gpu_model=gpu_model, label=label, source=command
    )
    everyone = store.rows(cfg, node=None, kind=name)
    others = [r for r in everyone if r["node"] != node]
    refs = compare.reference(others, pinned=cfg.baseline.pinned)
    mine = [r for r in everyone if r["node"] == node]
    if not any(r["label"] == label for r in mine):  # history not readable here: the result
        now = time.time()
        mine = [
            {"ts": now, "id": 0, "node": node, "kind": name, "metric": m.metric,
             "value": m.value, "unit": m.unit, "gpu": m.gpu, "gpu_model": gpu_model}
            for m in result.measurements
        ]  # fmt: skip
    devs = compare.compare(mine, node, refs, cfg.baseline.warn_pct, cfg.baseline.fail_pct)
    problems += [d.line() for d in devs if d.status == "fail"]
    return BenchOutcome(
        name,
        command,
        passed=not problems,
        stored=stored,
        problems=tuple(problems),
        deviations=tuple(d.to_dict() for d in devs),
    )


def prolog_bench(
    cfg: Config, node: str, gpu_model: str | None, *, now: float, parse: Parse | None = None
) -> BenchOutcome | None:
    """The prolog's optional short bandwidth test: run only when the node's last validation
    or prolog run of it is older than ``baseline.prolog_bench_max_age_s``; stored with label
    "prolog" and compared with the fleet. None when not due (or not configured)."""
    from slurmhealth.baseline import store

    bc = cfg.baseline
    if bc.prolog_bench_max_age_s <= 0 or not bc.prolog_bench_command.strip():
        return None
    rows = store.rows(cfg, node=node, kind=bc.prolog_bench_kind)
    last = max((r["ts"] for r in rows if r.get("label") in (LABEL, "prolog")), default=None)
    if last is not None and now - last < bc.prolog_bench_max_age_s:
        return None
    if parse is None:
        from slurmhealth.baseline.parsers import parse as parse_output

        parse = parse_output
    return _benchmark(
        cfg,
        bc.prolog_bench_kind,
        bc.prolog_bench_command,
        node,
        gpu_model,
        parse,
        label="prolog",
        timeout_s=bc.prolog_bench_timeout_s,
    )


def _no_progress(_line: str) -> None:
    pass


def run_validate(
    cfg: Config,
    benchmarks: Sequence[str] | None = None,
    parse: Parse | None = None,
    progress: Progress = _no_progress,
) -> ValidateResult:
    """Checks (phase ``validate``, all GPUs), then each benchmark; the verdict is recorded
    in the node's history as the check run's status (``ok`` / ``fail``) with a finding per
    failed benchmark. ``progress`` gets one line as each step starts and ends."""
    from slurmhealth.hooks.check import run_check

    commands = select_benchmarks(cfg, benchmarks)
    if parse is None:
        from slurmhealth.baseline.parsers import parse as parse_output

        parse = parse_output
    progress(f"health checks on all GPUs ({len(commands)} benchmark(s) to follow)")
    check = run_check(cfg, phase=PHASE)
    progress(f"health checks: {check.status}")
    node = check.node or cfg.node_name
    models = [g.name for g in check.snapshot.gpus if g.name]
    gpu_model = models[0] if models else None
    reasons = [f"check {f.check}: {f.message}" for f in check.findings
               if f.severity >= Severity.FAIL]  # fmt: skip
    outcomes: list[BenchOutcome] = []
    _mark(cfg, check.run_id, "running")  # a killed validation never reads as passed
    try:
        for i, (name, command) in enumerate(commands.items(), 1):
            timeout = cfg.baseline.validate_timeout_s
            progress(f"[{i}/{len(commands)}] {name}: started (at most {timeout:g} s): {command}")
            started = time.monotonic()
            outcome = _benchmark(cfg, name, command, node, gpu_model, parse)
            outcome = dataclasses.replace(outcome, seconds=time.monotonic() - started)
            progress(f"[{i}/{len(commands)}] {name}: " + _done(outcome))
            outcomes.append(outcome)
            reasons += [f"{name}: {p}" for p in outcome.problems]
    except BaseException:
        reasons.append("validation interrupted")
        raise
    finally:
        result = ValidateResult(
            node=node,
            run_id=check.run_id,
            check_status=check.status,
            check_findings=tuple(f"{f.check}: {f.message}" for f in check.findings),
            benchmarks=tuple(outcomes),
            reasons=tuple(reasons),
        )
        _record(cfg, result, check.snapshot.ts)
    return result


def _done(outcome: BenchOutcome) -> str:
    if outcome.skipped:
        return f"SKIPPED: {outcome.skipped}"
    return f"{outcome.status} in {outcome.seconds:.1f} s"


def _mark(cfg: Config, run_id: str, status: str) -> None:
    from slurmhealth.history import History, records

    run = {"run_id": run_id, "phase": PHASE, "status": status}
    with History.for_node(cfg) as db:
        db.write(records.batch([records.check_run(run, upsert=True)]))


def _record(cfg: Config, result: ValidateResult, ts: float) -> None:
    """The check run's row gets the verdict; each failed benchmark becomes a finding."""
    from slurmhealth.history import History, records

    findings = [
        records.finding(_finding(result, b, ts)) for b in result.benchmarks if b.status != "ok"
    ]
    run = {
        "run_id": result.run_id,
        "phase": PHASE,
        "status": result.status,
        "exit_code": result.exit_code,
    }
    with History.for_node(cfg) as db:
        db.write(records.batch([*findings, records.check_run(run, upsert=True)]))


def _finding(result: ValidateResult, b: BenchOutcome, ts: float) -> dict[str, Any]:
    """A failed benchmark's finding (fail, drain) or a skipped one's (info, record)."""
    sev = Severity.INFO if b.skipped else Severity.FAIL
    return {
        "run_id": result.run_id,
        "ts": ts,
        "node": result.node,
        "check_name": f"baseline.{b.name}",
        "severity": sev.label,
        "severity_value": int(sev),
        "message": f"skipped: {b.skipped}" if b.skipped else "; ".join(b.problems),
        "action": "record" if b.skipped else "drain",
        "hint": f"benchmark: {b.command}",
        "evidence": {"deviations": list(b.deviations)},
    }
