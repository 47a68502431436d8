"""Mutation score of the modules that decide drains, access and verdicts (mutmut 3).

Usage (from the repository, after scripts/bootstrap):

    .venv/bin/python benchmarks/mutation_score.py [--group NAME ...] [--max-children N]
                                                   [--keep] [--json FILE]

For each group below (decision modules and the unit tests that judge them) it copies the
tracked tree into a scratch folder under /var/tmp, points ``[tool.mutmut]`` at the group's
files and tests, runs ``mutmut run`` (every mutant is run against the tests that cover the
mutated function, in a forked process), and prints per module: mutants, killed, survived,
no covering test, timeouts, the score, and each surviving mutant with its diff line.

The score is killed / (all - equivalent): a mutant listed in
``benchmarks/mutation_equivalent.toml`` (name = "why it is equivalent") behaves exactly as
the original, so no test can kill it; every other survivor, and every mutant no test
covers, counts against the score. A listed mutant that the tests kill counts as killed and
is printed as stale (mutmut numbers mutants by position, so an edit renumbers them).
Timeouts count as killed (mutmut's own rule: a mutant that makes the tests hang was noticed).
Not part of CI (minutes per group); run it before resolving an issue that touches these
modules. Needs ``pip install mutmut`` in the venv (the ``mutation`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EQUIVALENT = REPO / "benchmarks" / "mutation_equivalent.toml"
ALSO_COPY = ["scenarios", "scripts", "deploy", "docs", "prolog", "epilog", "healthcheck",
             "sbatch-templates", "README.md"]  # fmt: skip

CHECK_MODULES = ("gpu", "memory", "nvlink", "pcie", "thermal", "counters", "fabric")
# group -> (files to mutate, tests that judge them)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "access": (["slurmhealth/access/__init__.py"], ["tests/unit/test_access.py"]),
    "xid": (
        ["slurmhealth/checks/xid.py", "slurmhealth/checks/xid_table.py"],
        [
            "tests/unit/test_xid_table.py",
            "tests/unit/test_kernel_checks.py",
            "tests/unit/test_xid_verdicts.py",
            "tests/unit/test_xid_nvlink5.py",
        ],
    ),
    "kernel-position": (
        ["slurmhealth/kernel_log/position.py"],
        ["tests/unit/test_kernel_position.py", "tests/unit/test_kernel_position_rules.py"],
    ),
    "drain": (
        ["slurmhealth/hooks/drain.py"],
        [f"tests/unit/test_{t}.py" for t in ("drain_outcomes", "hooks_decisions", "hooks_pure")],
    ),
    "resume": (
        ["slurmhealth/hooks/resume.py"],
        [
            f"tests/unit/test_{t}.py"
            for t in ("resume_outcomes", "hooks_decisions", "hooks_pure", "healthcheck")
        ],
    ),
    "optout": (
        ["slurmhealth/model_records.py"],
        ["tests/unit/test_optout.py", "tests/unit/test_model_records.py"],
    ),
    "checks": (
        [f"slurmhealth/checks/{m}.py" for m in CHECK_MODULES],
        [
            f"tests/unit/test_{t}.py"
            for t in (
                "checks",
                "fabric_findings",
                "gpu_findings",
                "counter_rates",
                "nvlink_counters",
                "blackwell_topology",
            )
        ],
    ),
    "diagnose": (
        ["slurmhealth/diagnose/engine.py"],
        [
            f"tests/unit/test_{t}.py"
            for t in (
                "diagnose",
                "diagnose_kernel",
                "diagnose_texts",
                "diagnose_verdicts",
                "diagnose_order",
            )
        ],
    ),
    "exposition": (
        ["slurmhealth/metrics/exposition.py"],
        ["tests/unit/test_exposition.py", "tests/unit/test_metrics.py"],
    ),
    "retention": (["slurmhealth/history/retention.py"], ["tests/unit/history"]),
    "baseline-units": (
        ["slurmhealth/baseline/compare.py"],
        ["tests/unit/test_baseline_judgement.py", "tests/unit/test_baseline_compare.py"],
    ),
    "parse-nccl": (["slurmhealth/baseline/parse_nccl.py"], ["tests/unit/test_parse_nccl.py"]),
    "remediation": (
        ["slurmhealth/checks/remediation.py", "slurmhealth/hooks/remediate_plan.py"],
        ["tests/unit/test_remediate_plan.py", "tests/unit/test_remediate.py"],
    ),
    # the repair's orchestration (1,000 mutants, each over simulated repairs: about an hour)
    "remediation-run": (
        ["slurmhealth/hooks/remediate.py"],
        ["tests/unit/test_remediate.py", "tests/unit/test_remediate_run.py"],
    ),
    "sweep": (
        ["slurmhealth/sweep/verdict.py", "slurmhealth/sweep/plan.py"],
        [f"tests/unit/test_sweep_{t}.py" for t in ("verdict", "evidence", "plan")],
    ),
}
# slurmhealth.checks.xid.x_judge__mutmut_3, slurmhealth.hooks.drain.xǁDrainOutcomeǁm__mutmut_1
NAME = re.compile(r"^(?P<module>[\w.]+?)\.x(?:ǁ\w+ǁ)?_?(?P<fn>\w+?)__mutmut_(?P<n>\d+)$")


@dataclass
class ModuleScore:
    module: str
    statuses: Counter[str] = field(default_factory=Counter)
    survivors: list[str] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    equivalent_shown: list[str] = field(default_factory=list)  # to check each reason still fits

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    @property
    def killed(self) -> int:
        return self.statuses["killed"] + self.statuses["timeout"]

    @property
    def score(self) -> float:
        judged = self.total - len(self.equivalent)
        return self.killed / judged if judged else 1.0


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=REPO, capture_output=True,
                           check=True).stdout.split(b"\0")  # fmt: skip
    for raw in files:
        if not raw:
            continue
        src = REPO / raw.decode()
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree
        target = dest / raw.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)


def _configure(dest: Path, files: list[str], tests: list[str]) -> None:
    config = {
        "source_paths": ["slurmhealth/"],
        "only_mutate": files,
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q"],
        "also_copy": ALSO_COPY,
    }
    body = "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items())
    with (dest / "pyproject.toml").open("a") as fh:
        fh.write(body)
    (dest / "mutants").mkdir()
    # the tests find the venv beside them (REPO/.venv): the mutants' copy is their REPO
    (dest / "mutants" / ".venv").symlink_to(REPO / ".venv")


def _mutmut(dest: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("mutmut")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([str(exe), *args], cwd=dest, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)  # fmt: skip


def _first_change(dest: Path, name: str) -> str:
    shown = _mutmut(dest, "show", name, timeout=120).stdout.splitlines()
    minus = next((ln[1:].strip() for ln in shown if ln[:1] == "-" and ln[:3] != "---"), "")
    plus = next((ln[1:].strip() for ln in shown if ln[:1] == "+" and ln[:3] != "+++"), "")
    return f"{minus[:90]}  ->  {plus[:90]}"


def run_group(
    name: str, max_children: int, keep: bool, equivalent: dict[str, str]
) -> list[ModuleScore]:
    files, tests = GROUPS[name]
    dest = Path(tempfile.mkdtemp(prefix=f"slurmhealth-mutation-{name}-", dir="/var/tmp"))
    dest.chmod(0o755)  # the access tests run the mutated CLI as an unprivileged user
    try:
        _copy_tree(dest)
        _configure(dest, files, tests)
        started = time.monotonic()
        ran = _mutmut(dest, "run", "--max-children", str(max_children))
        results = _mutmut(dest, "results", "--all", "true").stdout
        if ran.returncode != 0 and not results.strip():
            tail = (ran.stdout + ran.stderr).strip().splitlines()[-5:]
            raise SystemExit(f"mutmut failed for group {name}: " + " | ".join(tail))
        scores: dict[str, ModuleScore] = {}
        for line in results.splitlines():
            mutant, sep, status = line.strip().partition(": ")
            match = NAME.match(mutant)
            if not sep or match is None:
                continue
            score = scores.setdefault(match["module"], ModuleScore(match["module"]))
            score.statuses[status] += 1
            if mutant in equivalent and status in ("survived", "no tests"):
                score.equivalent.append(mutant)
                score.equivalent_shown.append(f"{mutant}: {_first_change(dest, mutant)}")
            elif mutant in equivalent:  # a test tells it apart: the entry is stale or renumbered
                score.stale.append(f"{mutant} [{status}]: {_first_change(dest, mutant)}")
            elif status in ("survived", "no tests"):
                score.survivors.append(f"{mutant} [{status}]: {_first_change(dest, mutant)}")
        print(f"# group {name}: {sum(s.total for s in scores.values())} mutants in "
              f"{time.monotonic() - started:.0f} s", file=sys.stderr)  # fmt: skip
        return list(scores.values())
    finally:
        if keep:
            print(f"# kept {dest}", file=sys.stderr)
        else:
            shutil.rmtree(dest, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", action="append", choices=sorted(GROUPS), help="default: all")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        print("mutation_score: mutmut is not installed in this venv "
              "(.venv/bin/pip install mutmut)", file=sys.stderr)  # fmt: skip
        return 2
    equivalent = tomllib.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    scores: list[ModuleScore] = []
    for name in args.group or list(GROUPS):
        scores += run_group(name, args.max_children, args.keep, equivalent)
    print(f"{'module':40} {'mutants':>7} {'killed':>6} {'surv.':>5} {'no test':>7} "
          f"{'equiv.':>6} {'score':>6}")  # fmt: skip
    for s in sorted(scores, key=lambda s: s.module):
        print(f"{s.module:40} {s.total:7} {s.killed:6} {s.statuses['survived']:5} "
              f"{s.statuses['no tests']:7} {len(s.equivalent):6} {s.score:6.1%}")  # fmt: skip
    total = sum(s.total for s in scores)
    killed = sum(s.killed for s in scores)
    equiv = sum(len(s.equivalent) for s in scores)
    overall = killed / (total - equiv) if total > equiv else 1.0
    print(f"{'all':40} {total:7} {killed:6} {'':5} {'':7} {equiv:6} {overall:6.1%}")
    for s in scores:
        for line in s.survivors:
            print(f"survivor {line}")
        for line in s.equivalent_shown:
            print(f"equivalent {line}")
        for line in s.stale:
            print(f"listed as equivalent but killed (renumbered? fix {EQUIVALENT.name}): {line}")
    if args.json:
        args.json.write_text(json.dumps({
            "overall": overall, "total": total, "killed": killed, "equivalent": equiv,
            "modules": {s.module: {"total": s.total, "killed": s.killed, "score": s.score,
                                   "statuses": dict(s.statuses), "survivors": s.survivors}
                        for s in scores},
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
