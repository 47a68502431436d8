"""What the owner of a job reads first: the verdict, whose fault, what they and the admins
do; then efficiency and task metrics; diagnoses one line per cause; the timeline collapsed;
evidence once. Asserted on what each format shows (terminal lines, markdown, JSON keys)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from slurmhealth.cli.options import Ctx
from slurmhealth.cli.report import report as report_command
from slurmhealth.diagnose.facts import Facts, GpuStats, NodeFacts
from slurmhealth.model_records import Job
from slurmhealth.report.build import Report
from slurmhealth.report.efficiency import efficiency
from slurmhealth.report.gather import build_report
from slurmhealth.report.html import to_html
from slurmhealth.report.plots import nice_ticks, time_ticks
from slurmhealth.report.render import print_report, to_json, to_markdown
from tests.unit.report_jobs import DAY_T0, day_job, idle_job
from tests.unit.test_report import build, make_cluster


@pytest.fixture
def failed_job(tmp_path: Path) -> Path:
    """test_report's 3-node job 42: GPU 5 on n2 fell off the bus, n2 drained."""
    return make_cluster(tmp_path)


def terminal(r: Report, full: bool = False) -> list[str]:
    con = Console(record=True, width=240)
    print_report(r, con, full)
    return [line.rstrip() for line in con.export_text().splitlines()]


def line_with(lines: list[str], start: str) -> int:
    return next(i for i, x in enumerate(lines) if x.startswith(start))


def test_hardware_failure_says_not_your_code_and_what_was_done(failed_job: Path) -> None:
    r = build(failed_job)
    lines = terminal(r)
    verdict = line_with(lines, "verdict: GPU 5 on n2 fell off the bus (Xid 79)")
    fault = line_with(lines, "whose fault: hardware (confidence 95%)")
    you = line_with(lines, "what you should do: not your code")
    done = line_with(lines, "already done: n2 drained by slurmhealth epilog at 23:13Z")
    admins = line_with(lines, "what the admins should do: n2 is already drained")
    assert verdict < fault < you < done < admins < line_with(lines, "efficiency")
    assert "--exclude=n2" in lines[you] and "n2 is already drained" in " ".join(lines[you:done])
    assert "Left to do: keep n2 drained; reset the GPU" in " ".join(lines[admins : admins + 2])
    assert line_with(lines, "efficiency") < line_with(lines, "diagnoses")
    assert line_with(lines, "diagnoses") < line_with(lines, "timeline (UTC)")
    data = to_json(r)
    a = data["answer"]
    assert (a["fault_class"], a["confidence"]) == ("hardware", 0.95)
    assert a["user_action"].startswith("not your code") and a["admin_done"]
    assert all({"fault_class", "user_action", "admin_action"} <= set(d) for d in data["diagnoses"])
    md = to_markdown(r)
    assert md.index("**Whose fault:** hardware") < md.index("**What you should do:**")
    assert md.index("**What the admins should do:**") < md.index("## Efficiency")


def test_throttling_all_day_is_one_line_and_the_timeline_collapses(tmp_path: Path) -> None:
    r = build_report(day_job(tmp_path), "77")
    lines = terminal(r)
    throttled = [x for x in lines if "throttled" in x and "n2 GPU 3" in x]
    assert throttled == [
        "  GPU clocks throttled (thermal or power) on n2 GPU 3: seen 24 times 00:01Z-23:01Z"
        "  [system]"
    ]
    assert line_with(lines, "whose fault: system")
    rows = [x for x in lines if "hw_thermal slowdown" in x and "│" in x]
    assert len(rows) == 1 and "(x24 until 2023-11-15T23:01:00Z)" in rows[0]
    assert "heartbeat" not in "\n".join(lines)  # info chatter is not what matters
    full = terminal(r, full=True)
    assert sum("hw_thermal slowdown" in x and "│" in x for x in full) == 24
    md = to_markdown(r)
    assert md.count("throttled (thermal or power) on n2 GPU 3") == 2  # the list and its texts
    assert "more entries: `--timeline`" in md and len(md.splitlines()) < 120
    assert sum("hw_thermal" in x for x in to_markdown(r, True).splitlines()) >= 24
    groups = json.loads(json.dumps(to_json(r)))["diagnosis_groups"]
    assert [(g["rule"], g["node"], g["gpus"], g["count"]) for g in groups] == [
        ("thermal_or_power_throttling", "n2", [3], 24)
    ]


def test_task_metrics_in_every_format(tmp_path: Path) -> None:
    r = build_report(day_job(tmp_path), "77")
    assert any("900 -> 880" in x and x.count("170000") for x in terminal(r))
    assert "| n2 | 170000 | 0.5 | 900 -> 880 |" in to_markdown(r)
    assert "<td>900 -&gt; 880</td>" in to_html(r)
    assert to_json(r)["tasks"][0]["samples_per_second_last"] == 880.0


def test_healthy_job_with_idle_gpus_says_so(tmp_path: Path) -> None:
    r = build_report(idle_job(tmp_path), "34")
    lines = terminal(r)
    assert "  GPUs 0-7 on n1 averaged 0% utilisation: the job did not use its GPUs" in lines
    assert line_with(lines, "whose fault: application")
    assert line_with(lines, "verdict: the job did not use its GPUs on n1")
    assert "nothing notable" not in "\n".join(lines) and "Failure at" not in to_markdown(r)
    eff = to_json(r)["efficiency"]
    assert (eff["gpus_held"], eff["gpus_idle"]) == (8, 8)
    assert "GPUs 0-7 on n1 averaged 0% utilisation" in to_html(r)


def test_efficiency_time_and_memory_against_what_was_asked() -> None:
    gpus = tuple(GpuStats(gpu=i, util_mean=80.0 if i else 1.0, mem_peak_bytes=40 * 2**30,
                          mem_total_bytes=80 * 2**30) for i in range(4))  # fmt: skip
    job = Job(job_id="5", start_ts=0.0, end_ts=3600.0, time_limit_s=4 * 3600.0)
    lines = efficiency(Facts(job=job, nodes=(NodeFacts(node="g1", gpus=gpus),))).lines
    assert lines == (
        "GPU utilisation: mean 60% over 4 GPU(s) on 1 node(s) (g1 60%)",
        "GPU 0 on g1 averaged under 5% utilisation: idle while the node's other GPUs worked",
        "GPU memory: peak 40.0 GiB on one GPU of 80.0 GiB (50%)",
        "time: 1h00m used of the 4h00m asked (25%)",
    )


def test_header_shows_dash_for_unset_and_evidence_once_relative(failed_job: Path) -> None:
    r = build(failed_job)
    r = replace(r, job=replace(r.job, account="(null)", qos=""))
    lines = terminal(r)
    assert "account: -" in "\n".join(lines) and "(null)" not in "\n".join(lines)
    bundle = failed_job / "evidence" / "42" / "n3"
    n3 = next(e for e in r.evidence if e.node == "n3")
    twice = replace(n3, files=(*n3.files, {"path": str(bundle / "dmesg.txt")}))
    r = replace(r, evidence=tuple(twice if e.node == "n3" else e for e in r.evidence))
    md = to_markdown(r)
    assert "- n3 (summary) n3/: dmesg.txt" in md.splitlines()
    assert md.count("dmesg.txt") == 1 and str(bundle) not in md
    assert "| account | - |" in md


def test_plots_round_ticks_and_misbehaving_gpus_highlighted(failed_job: Path) -> None:
    assert nice_ticks(78) == [0, 20, 40, 60, 80]
    assert nice_ticks(607) == [0, 200, 400, 600, 800]
    assert time_ticks(DAY_T0 + 10, DAY_T0 + 86400) == [DAY_T0 + h * 3600 for h in (6, 12, 18, 24)]
    page = to_html(build(failed_job))
    assert ">600 W</text>" in page and ">78 W<" not in page
    n2 = page[page.index('id="plot-util-n2"') :]
    n2 = n2[: n2.index("</svg>")]
    assert 'id="plot-util-n2-gpu5" data-gpu="5" data-odd="1"' in n2
    assert n2.count('data-odd="0"') == 7 and n2.count('stroke="#b8b8b8"') == 7


def _cli(cfg_path: Path, *args: str) -> Any:
    @click.group()
    def group() -> None:
        pass

    group.add_command(report_command)
    return CliRunner().invoke(group, ["report", *args], obj=Ctx(str(cfg_path), None, False))


def test_cli_timeline_flag(tmp_path: Path) -> None:
    day_job(tmp_path)
    short = _cli(tmp_path / "config.toml", "77", "--markdown")
    full = _cli(tmp_path / "config.toml", "77", "--markdown", "--timeline")
    assert short.exit_code == 0 and full.exit_code == 0, short.output + full.output
    assert short.output.count("hw_thermal slowdown") < 10 <= full.output.count("hw_thermal")
    data = json.loads(_cli(tmp_path / "config.toml", "77", "--json").output)
    assert len(data["timeline"]) > len(data["timeline_summary"]) == 7


def test_json_of_a_day_long_and_an_idle_job_follow_the_schema(tmp_path: Path) -> None:
    from tests.unit.test_report import SCHEMA_PATH, _validate

    schema = json.loads(SCHEMA_PATH.read_text())
    for r in (
        build_report(day_job(tmp_path / "a"), "77"),
        build_report(idle_job(tmp_path / "b"), "34"),
    ):
        data = json.loads(json.dumps(to_json(r)))
        _validate(data, schema, schema)
        assert {"answer", "efficiency", "diagnosis_groups", "timeline_summary"} <= set(data)
