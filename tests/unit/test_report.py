"""``slurmhealth report``: a 3-node job (n1, n2 live histories; n3 only through its
summary.json) merged, diagnosed, filtered, rendered and permission-checked."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from slurmhealth.cli.options import Ctx
from slurmhealth.cli.report import parse_window, report
from slurmhealth.config import load_config
from slurmhealth.diagnose.facts import GpuStats, NodeFacts
from slurmhealth.errors import UsageError
from slurmhealth.history import Batch, History
from slurmhealth.history.rows import sample_columns
from slurmhealth.report.build import Report
from slurmhealth.report.gather import PermissionDenied, build_report
from slurmhealth.report.html import to_html
from slurmhealth.report.render import print_report, to_json, to_markdown
from tests.support.skips import unavailable

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
END = T0 + 3600
XID_TS = T0 + 1800
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "report-schema.json"
NOBODY = 65534


# -- history rows as the prolog/epilog/sidecar write them -------------------------------------


def job_row(job_id: str, node: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "node": node,
        "user": user,
        "uid": pwd.getpwnam(user).pw_uid,
        "account": "proj",
        "partition": "gpu",
        "qos": "normal",
        "priority": 4242,
        "nodes": "n[1-3]",
        "gpus": list(range(8)),
        **extra,
    }


def run_row(
    run_id: str, ts: float, node: str, job: str | None, phase: str, status: str
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "ts": ts,
        "node": node,
        "job_id": job,
        "phase": phase,
        "gpus": list(range(8)),
        "status": status,
        "exit_code": int(status == "fail"),
        "duration_s": 0.4,
        "backend": "sim",
        "error": None,
    }


def finding_row(
    run_id: str,
    ts: float,
    node: str,
    job: str | None,
    gpu: int,
    xid: int,
    severity: str = "critical",
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "ts": ts,
        "node": node,
        "job_id": job,
        "check_name": "xid",
        "severity": severity,
        "severity_value": {"warn": 20, "critical": 40}[severity],
        "gpu": gpu,
        "uuid": f"GPU-{node}-{gpu}",
        "message": f"Xid {xid} on 0000:{gpu}5:00.0",
        "action": "drain",
        "hint": "see NVIDIA's Xid catalog",
        "evidence": {"xid": xid, "pci_bus_id": f"0000:{gpu}5:00.0", "count": 1},
    }


def event_row(
    ts: float,
    node: str,
    job: str,
    gpu: int | None,
    kind: str,
    severity: str,
    message: str,
    **evidence: Any,
) -> dict[str, Any]:
    return {
        "ts": ts,
        "node": node,
        "job_id": job,
        "gpu": gpu,
        "uuid": None,
        "kind": kind,
        "severity": severity,
        "message": message,
        "evidence": evidence,
    }


def sample_rows(node: str, job: str, lost_gpu: int | None = None) -> list[dict[str, Any]]:
    rows = []
    for i in range(61):
        ts = T0 + 60 * i
        for gpu in range(8):
            dead = gpu == lost_gpu and ts >= XID_TS
            metrics = {
                "utilization_gpu_pct": 0.0 if dead else 95.0 - gpu,
                "power_w": 90.0 if dead else 600.0 + gpu,
                "memory_used_bytes": 60 * 2**30,
                "temperature_c": 70.0,
                "margin_temperature_c": 20.0,
                "clock_event_reasons": 0,
                "pcie_gen": 5,
                "pcie_width": 16,
                "pcie_replay_errors": 0,
                "nvlink_active": 18,
                "nvlink_errors": 0,
                "status": "ok",
            }
            rows.append(
                {
                    "ts": ts,
                    "node": node,
                    "job_id": job,
                    "gpu": gpu,
                    "uuid": f"GPU-{node}-{gpu}",
                    "metrics": metrics,
                    **sample_columns(metrics),  # as the sidecar writes them
                }
            )
    return rows


def task_row(ts: float, node: str, job: str, sps: float, steps: int) -> dict[str, Any]:
    return {
        "ts": ts,
        "node": node,
        "job_id": job,
        "gpu": None,
        "uuid": None,
        "metrics": {
            "kind": "task",
            "samples_per_second": sps,
            "step_seconds": 0.5,
            "steps_total": steps,
        },
    }


def write(
    path: Path, *inserts: tuple[str, dict[str, Any]], job: dict[str, Any] | None = None
) -> None:
    with History(path) as db:
        assert db.write(
            Batch(inserts=list(inserts), upserts=[("jobs", job, "job_id")] if job else [])
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    return make_cluster(tmp_path)


def make_cluster(tmp_path: Path) -> Path:
    """Job 42 (root's) on n[1-3]: Xid 79 on n2 GPU 5 mid-job, n2 drained by the epilog;
    job 43 (nobody's) on n1; older jobs 17/18 with incidents on n2 GPU 5 / Xid 79."""
    dbs, evidence = tmp_path / "db", tmp_path / "evidence"
    (tmp_path / "config.toml").write_text(
        f'[node]\nname = "n1"\n[paths]\ndb = "{dbs}/{{node}}.db"\nevidence_dir = "{evidence}"\n'
    )
    n1, n2 = dbs / "n1.db", dbs / "n2.db"
    write(
        n1,
        ("check_runs", run_row("p1", T0, "n1", "42", "prolog", "ok")),
        job=job_row("42", "n1", "root", start_ts=T0, state="running"),
    )
    write(
        n1,
        *[("samples", r) for r in sample_rows("n1", "42")],
        ("samples", task_row(T0 + 60, "n1", "42", 1000.0, 10)),
        ("samples", task_row(END - 60, "n1", "42", 600.0, 7000)),
        ("events", event_row(T0 + 900, "n1", "42", 3, "straggler", "warn", "GPU 3 slow")),
        ("check_runs", run_row("e1", END, "n1", "42", "epilog", "ok")),
    )
    write(
        n1,
        (
            "events",
            event_row(
                T0 - 7200,
                "n1",
                "18",
                0,
                "xid",
                "critical",
                "Xid 79 GPU has fallen off the bus on GPU 0",
                xid=79,
            ),
        ),
    )
    write(
        n1,
        ("check_runs", run_row("p43", T0, "n1", "43", "prolog", "ok")),
        job=job_row("43", "n1", "nobody", start_ts=T0, state="running"),
    )
    write(
        n2,
        ("check_runs", run_row("p2", T0 + 1, "n2", "42", "prolog", "ok")),
        job=job_row("42", "n2", "root", start_ts=T0 + 1, state="running"),
    )
    write(
        n2,
        *[("samples", r) for r in sample_rows("n2", "42", lost_gpu=5)],
        (
            "events",
            event_row(
                XID_TS,
                "n2",
                "42",
                5,
                "xid",
                "critical",
                "Xid 79 GPU has fallen off the bus on GPU 5",
                xid=79,
            ),
        ),
        ("events", event_row(XID_TS + 5, "n2", "42", 5, "gpu_lost", "critical", "GPU 5 lost")),
    )
    write(
        n2,
        ("check_runs", run_row("e2", END, "n2", "42", "epilog", "fail")),
        ("findings", finding_row("e2", END, "n2", "42", 5, 79)),
        (
            "drains",
            {
                "ts": END + 1,
                "node": "n2",
                "job_id": "42",
                "run_id": "e2",
                "state": "drained",
                "reason": "slurmhealth: xid gpu5 Xid 79",
                "actor": "slurmhealth epilog",
                "detail": {"note": ""},
            },
        ),
        job=job_row("42", "n2", "root", end_ts=END, state="failed", exit_code="0:9"),
    )
    write(
        n2,
        ("check_runs", run_row("p17", T0 - 86400, "n2", "17", "prolog", "fail")),
        ("findings", finding_row("p17", T0 - 86400, "n2", "17", 5, 48, "warn")),
    )
    bundle = evidence / "42" / "n3"
    bundle.mkdir(parents=True)
    gpus = tuple(
        GpuStats(
            gpu=g,
            samples=61,
            util_mean=94.0,
            util_p5=93.0,
            power_mean_w=610.0,
            series=tuple((T0 + 60 * i, 94.0, 610.0) for i in range(61)),
        )
        for g in range(8)
    )
    n3 = NodeFacts(
        node="n3",
        gpus=gpus,
        bundle_dir=str(bundle),
        runs=(run_row("p3", T0 + 2, "n3", "42", "prolog", "ok"),),
        events=(
            event_row(
                XID_TS - 10, "n3", "42", 2, "nvlink_errors", "warn", "NVLink replays on GPU 2"
            ),
        ),
    )
    vouched(bundle, n3.to_dict(), [{"path": "dmesg.txt"}])
    return tmp_path


def vouched(folder: Path, summary: dict[str, Any], others: list[Any] | None = None) -> None:
    """``summary.json`` and the manifest that vouches for it, as the epilog writes them."""
    from slurmhealth.evidence.bundle import file_entry

    data = json.dumps(summary).encode()
    (folder / "summary.json").write_bytes(data)
    files = [*(others or []), file_entry("summary.json", data, "summary")]
    (folder / "manifest.json").write_text(json.dumps({"files": files}))


def build(cluster: Path, job: str = "42", **kw: Any) -> Report:
    return build_report(load_config(str(cluster / "config.toml"), env={}), job, **kw)


# -- build ------------------------------------------------------------------------------------


def test_merges_three_nodes_history_preferred(cluster: Path) -> None:
    r = build(cluster)
    assert [n.node for n in r.nodes] == ["n1", "n2", "n3"]
    assert [(n, s) for n, s, _ in r.sources] == [
        ("n1", "history"),
        ("n2", "history"),
        ("n3", "summary"),
    ]
    j = r.job
    assert (j.user, j.account, j.partition, j.qos, j.priority) == (
        "root",
        "proj",
        "gpu",
        "normal",
        4242,
    )
    assert j.node_names == ("n1", "n2", "n3") and j.gpus == tuple(range(8))
    assert (j.start_ts, j.end_ts, j.state, j.exit_code) == (T0, END, "failed", "0:9")
    n2 = {g.gpu: g for g in r.nodes[1].gpus}
    assert n2[5].util_min == 0.0 and n2[4].util_min == 91.0
    assert r.nodes[0].task is not None and r.nodes[0].task.samples_per_second_last == 600.0
    assert [(s.node, s.gpu) for s in r.stragglers] == [("n1", 3), ("n2", 5)]
    ev = {e.node: e for e in r.evidence}
    assert ev["n3"].manifest and ev["n3"].files[0]["path"].endswith("n3/dmesg.txt")


def test_timeline_is_utc_ordered_across_nodes(cluster: Path) -> None:
    r = build(cluster)
    ts = [e.ts for e in r.timeline]
    assert ts == sorted(ts)
    assert {e.node for e in r.timeline} == {None, "n1", "n2", "n3"}
    kinds = {e.kind for e in r.timeline}
    assert kinds == {"job", "run", "finding", "event", "drain", "task"}
    assert r.failure_ts == XID_TS  # the first critical entry
    first_bad = next(e for e in r.timeline if e.severity == "critical")
    assert (first_bad.node, first_bad.gpu, first_bad.kind) == ("n2", 5, "event")


def test_window_keeps_entries_near_the_failure(cluster: Path) -> None:
    r = build(cluster, window_s=60)
    assert r.timeline and all(abs(e.ts - XID_TS) <= 60 for e in r.timeline)
    assert {(e.node, e.kind) for e in r.timeline} == {("n2", "event"), ("n3", "event")}
    assert len(build(cluster).timeline) > len(r.timeline)
    assert parse_window("10m") == 600 and parse_window("90") == 90 and parse_window(None) is None
    with pytest.raises(UsageError):
        parse_window("soon")


def test_past_incidents_same_gpu_or_xid(cluster: Path) -> None:
    r = build(cluster)
    got = [(i.job_id, i.node, i.gpu) for i in r.past_incidents]
    assert got == [("18", "n1", 0), ("17", "n2", 5)]  # newest first, never job 42 itself
    assert "79" in r.past_incidents[0].what and "48" in r.past_incidents[1].what


def test_verdict_names_xid_node_gpu_and_drain(cluster: Path) -> None:
    r = build(cluster)
    assert r.diagnoses
    top = r.diagnoses[0]
    text = " ".join(
        [r.verdict, top.title, top.root_cause, top.action, *(c.text for c in top.citations)]
    )
    assert "79" in text and "n2" in f"{text} {top.node}"
    assert top.gpu == 5 or re.search(r"GPU ?5\b", text, re.I)
    assert "drain" in text.lower()


# -- permission and unknown jobs --------------------------------------------------------------


def test_owner_root_and_others(cluster: Path) -> None:
    with pytest.raises(PermissionDenied, match="job 42 belongs to root; only root, root") as e:
        build(cluster, requester_uid=NOBODY)
    assert e.value.exit_code == 4 and isinstance(e.value, UsageError)
    assert build(cluster, "43", requester_uid=NOBODY).job.user == "nobody"  # the owner
    assert build(cluster, "43", requester_uid=0).job.user == "nobody"  # root reads any
    with pytest.raises(PermissionDenied, match="belongs to nobody; only nobody, root may"):
        build(cluster, "43", requester_uid=1)  # daemon


def test_unknown_job_and_bad_id(cluster: Path) -> None:
    with pytest.raises(UsageError, match=r"no record of job 999 in .*n1\.db.*evidence/999"):
        build(cluster, "999")
    with pytest.raises(UsageError, match="not a Slurm job id"):
        build(cluster, "../42")


# -- rendering --------------------------------------------------------------------------------


def _validate(value: Any, schema: dict[str, Any], root: dict[str, Any], at: str = "$") -> None:
    """The draft 2020-12 keywords docs/report-schema.json uses (jsonschema isn't installed)."""
    if "$ref" in schema:
        schema = {**root["$defs"][schema["$ref"].rsplit("/", 1)[1]], **schema}
    kinds: dict[str, type] = {
        "object": dict,
        "array": list,
        "string": str,
        "null": type(None),
        "boolean": bool,
    }
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(
            (t == "integer" and isinstance(value, int) and not isinstance(value, bool))
            or (t == "number" and isinstance(value, int | float) and not isinstance(value, bool))
            or (t in kinds and isinstance(value, kinds[t]))
            for t in types
        )
        assert ok, f"{at}: {value!r} is not {types}"
    assert "const" not in schema or value == schema["const"], at
    assert "enum" not in schema or value in schema["enum"], f"{at}: {value!r}"
    assert "minimum" not in schema or value >= schema["minimum"], at
    assert "maximum" not in schema or value <= schema["maximum"], at
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            assert key in value, f"{at}: {key} missing"
        for key, sub in value.items():
            if key in schema.get("properties", {}):
                _validate(sub, schema["properties"][key], root, f"{at}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                _validate(sub, schema["additionalProperties"], root, f"{at}.{key}")
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0), at
        assert len(value) <= schema.get("maxItems", len(value)), at
        for n, item in enumerate(value):
            prefix = schema.get("prefixItems", [])
            sub = prefix[n] if n < len(prefix) else schema.get("items")
            if sub:
                _validate(item, sub, root, f"{at}[{n}]")


def test_json_validates_against_the_schema(cluster: Path) -> None:
    data = json.loads(json.dumps(to_json(build(cluster))))
    schema = json.loads(SCHEMA_PATH.read_text())
    try:
        jsonschema: Any = importlib.import_module("jsonschema")
    except ImportError:
        _validate(data, schema, schema)
    else:
        jsonschema.Draft202012Validator(schema).validate(data)
    assert data["schema"] == "slurmhealth.report/1"
    assert len(data["gpus"]) == 24 and data["failure"] == "2023-11-14T22:43:20Z"
    with pytest.raises(AssertionError):
        _validate({**data, "timeline": [{"ts": "x"}]}, schema, schema)


def test_markdown_and_terminal(cluster: Path) -> None:
    r = build(cluster)
    md = to_markdown(r)
    assert "## Timeline (UTC)" in md and "2023-11-14T22:43:20Z" in md
    assert "| n2 | 5 |" in md and "▁" in md  # the GPU table with its sparkline plots
    from rich.console import Console

    con = Console(record=True, width=200)
    print_report(r, con)
    text = con.export_text()
    assert "verdict:" in text and "timeline (UTC)" in text and "n3" in text


def test_html_is_self_contained_with_plots(cluster: Path) -> None:
    page = to_html(build(cluster))
    assert not re.search(r"(?:https?:)?//[a-z]", page, re.I)  # no external URL of any kind
    assert "<link" not in page and "<script" not in page and "src=" not in page
    util = re.findall(r'<svg class="plot plot-util" id="plot-util-(\w+)"', page)
    power = re.findall(r'<svg class="plot plot-power" id="plot-power-(\w+)"', page)
    assert util == power == ["n1", "n2", "n3"]
    assert page.count('class="gpu-line"') == 48  # 8 GPUs x 3 nodes x 2 charts
    assert 'id="plot-util-n2-gpu5"' in page and "22:13:20Z" in page  # UTC axis
    assert 'class="timeline"' in page and "Xid 79" in page


# -- CLI ---------------------------------------------------------------------------------------


def _cli() -> click.Group:
    @click.group()
    @click.pass_context
    def group(ctx: click.Context) -> None:
        pass

    group.add_command(report)
    return group


def _invoke(cluster: Path, *args: str) -> Any:
    obj = Ctx(str(cluster / "config.toml"), None, False)
    return CliRunner().invoke(_cli(), ["report", *args], obj=obj)


def test_cli_json_markdown_html(cluster: Path, tmp_path: Path) -> None:
    if os.getuid() != 0:
        unavailable("job 42 belongs to root")
    res = _invoke(cluster, "42", "--json", "--window", "1m")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["schema"] == "slurmhealth.report/1" and data["window_s"] == 60
    res = _invoke(cluster, "42", "--markdown")
    assert res.exit_code == 0 and res.output.startswith("# slurmhealth report: job 42")
    out = tmp_path / "r.html"
    res = _invoke(cluster, "42", "--html", str(out))
    assert res.exit_code == 0 and "plot-util" in out.read_text()
    res = _invoke(cluster, "42")
    assert res.exit_code == 0 and "timeline (UTC)" in res.output


def test_cli_errors(cluster: Path) -> None:
    res = _invoke(cluster, "999", "--json")
    assert isinstance(res.exception, UsageError) and "no record of job 999" in str(res.exception)
    res = _invoke(cluster, "42", "--json", "--markdown")
    assert isinstance(res.exception, UsageError)


def test_current_summary_stands_in_for_history_stale_one_does_not(cluster: Path) -> None:
    from slurmhealth.history.read import Reader
    from slurmhealth.summary.collect import node_facts

    with Reader(cluster / "db" / "n1.db") as db:
        facts = node_facts(db, "42", "n1")
    folder = cluster / "evidence" / "42" / "n1"
    folder.mkdir()
    vouched(folder, facts.to_dict())
    fresh = build(cluster)
    assert fresh.sources[0][:2] == ("n1", "summary-current")
    assert fresh.nodes[0].gpus == facts.gpus and fresh.timeline == build(cluster).timeline
    write(cluster / "db" / "n1.db", ("events", event_row(END, "n1", "42", 1, "ecc", "fail", "ECC")))
    stale = build(cluster)
    assert stale.sources[0][:2] == ("n1", "history")  # a row the summary lacks: live history
    assert any(e.text == "ecc: ECC" for e in stale.timeline)
