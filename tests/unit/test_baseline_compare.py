"""Baselines: stored per node, compared with the fleet, outliers, validation, resume gating."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmhealth.baseline import compare, store
from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.cli.baseline import baseline, validate
from slurmhealth.cli.options import Ctx
from slurmhealth.config import Config, load_config
from slurmhealth.hooks.resume import drained_since, passing_validation

REPO = Path(__file__).resolve().parents[2]
BUSBW = "all_reduce_perf.busbw_avg"
SIM_MODEL = "NVIDIA H100 80GB HBM3"  # what the simulator's GPUs report


def row(node: str, metric: str, value: float, ts: float = 100.0, **kw: Any) -> dict[str, Any]:
    kind = kw.pop("kind", metric.split(".")[0] if metric.startswith("gpuburn") else "nccl")
    return {"id": 0, "ts": ts, "node": node, "kind": kind, "metric": metric, "value": value,
            "unit": kw.pop("unit", "GB/s"), "gpu_model": "H100", "gpu": kw.pop("gpu", None),
            "label": None, "source": None, **kw}  # fmt: skip


FLEET = [row("n1", BUSBW, 480.0), row("n2", BUSBW, 478.0), row("n3", BUSBW, 360.0)]


def test_compare_fails_the_slow_node_and_names_metric_and_deviation() -> None:
    refs = compare.reference(FLEET)
    (dev,) = compare.compare(FLEET, "n3", refs)
    assert dev.metric == BUSBW and dev.status == "fail"
    assert dev.deviation_pct == pytest.approx(-25, abs=0.5)
    assert BUSBW in dev.line() and "-24.7%" in dev.line() and dev.line().endswith("FAIL")
    assert [d.status for d in compare.compare(FLEET, "n1", refs)] == ["ok"]


def test_reference_uses_each_nodes_latest_value() -> None:
    rows = [*FLEET, row("n3", BUSBW, 479.0, ts=200.0)]  # n3 fixed later
    refs = compare.reference(rows)
    assert refs[("nccl", BUSBW, "H100")].value == 479.0
    assert compare.compare(rows, "n3", refs)[0].status == "ok"
    assert compare.outliers(rows) == []


def test_warn_between_thresholds() -> None:
    rows = [row("n1", BUSBW, 100.0), row("n2", BUSBW, 100.0), row("n3", BUSBW, 85.0)]
    refs = compare.reference(rows)
    assert compare.compare(rows, "n3", refs)[0].status == "warn"
    assert compare.compare(rows, "n3", refs, warn_pct=20, fail_pct=30)[0].status == "ok"


def test_outliers_lists_the_slow_node_only() -> None:
    (out,) = compare.outliers(FLEET)
    assert (out.where, out.metric, out.fleet_median) == ("n3", BUSBW, 478.0)
    assert out.ratio == pytest.approx(360 / 478, abs=1e-3)


def test_outlier_gpu_among_all_gpus_of_the_fleet() -> None:
    rows = [
        row(n, "gpuburn.gflops", 50000.0 * (0.7 if (n, g) == ("n2", 5) else 1), gpu=g,
            unit="Gflop/s")
        for n in ("n1", "n2", "n3")
        for g in range(8)
    ]  # fmt: skip
    (out,) = compare.outliers(rows)
    assert out.where == "n2:5" and out.gpu == 5 and out.ratio == pytest.approx(0.7)
    devs = compare.compare(rows, "n2", compare.reference(rows))
    assert [(d.gpu, d.status) for d in devs if d.status != "ok"] == [(5, "fail")]


def test_small_nccl_sizes_are_kept_but_not_judged() -> None:
    small, big = "all_reduce_perf.busbw@8192", f"all_reduce_perf.busbw@{32 << 20}"
    rows = [row(n, m, v) for n, v in (("n1", 0.65), ("n2", 0.66), ("n3", 0.31))
            for m in (small, big)]  # fmt: skip
    assert (("nccl", small, "H100")) in compare.reference(rows)
    devs = compare.compare(rows, "n3", compare.reference(rows))
    assert [(d.metric, d.status) for d in devs] == [(big, "fail")]
    assert [o.metric for o in compare.outliers(rows)] == [big]


def test_pinned_reference_overrides_the_median() -> None:
    refs = compare.reference(FLEET, pinned={f"nccl.{BUSBW}": 480})
    ref = refs[("nccl", BUSBW, "H100")]
    assert (ref.value, ref.source) == (480.0, "pinned")
    dev = compare.compare(FLEET, "n3", refs)[0]
    assert dev.line() == f"{BUSBW} 360.0 GB/s vs reference 480.0 (-25.0%) FAIL"
    assert compare.reference(FLEET, pinned={BUSBW: 360})[("nccl", BUSBW, "H100")].value == 360


def test_latency_is_lower_is_better() -> None:
    lat = "fio.randread.read_lat_p99"
    rows = [row(n, lat, v, kind="fio", unit="us") for n, v in
            (("n1", 100.0), ("n2", 102.0), ("n3", 150.0), ("n4", 70.0))]  # fmt: skip
    refs = compare.reference(rows)
    by_node = {n: compare.compare(rows, n, refs)[0] for n in ("n3", "n4")}
    assert by_node["n3"].status == "fail" and by_node["n3"].worse_pct > 20
    assert by_node["n4"].status == "ok" and by_node["n4"].worse_pct < 0  # faster is better
    assert [o.node for o in compare.outliers(rows)] == ["n3"]


def test_resume_gate_needs_a_passing_validation_after_the_drain() -> None:
    drains = [{"state": "drained", "ts": 50.0}, {"state": "resumed", "ts": 60.0},
              {"state": "drained", "ts": 100.0}]  # fmt: skip
    assert drained_since(None, drains) == 100.0
    assert drained_since(120.0, drains) == 120.0
    assert drained_since(None, []) is None
    before = {"phase": "validate", "status": "ok", "ts": 90.0}
    after_fail = {"phase": "validate", "status": "fail", "ts": 110.0}
    after_ok = {"phase": "validate", "status": "ok", "ts": 130.0}
    prolog_ok = {"phase": "prolog", "status": "ok", "ts": 140.0}
    assert passing_validation([before, prolog_ok], 100.0) is None
    assert passing_validation([before, after_fail], 100.0) is None
    assert passing_validation([before, after_fail, after_ok], 100.0) == after_ok
    assert passing_validation([after_ok, {**after_fail, "ts": 150.0}], 100.0) is None
    assert passing_validation([before], None) == before


# -- storage and CLI ------------------------------------------------------------------------


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        f"""
[node]
name = "n1"
[gpu]
backend = "sim"
sim_scenario = "{REPO / "scenarios" / "healthy.toml"}"
sim_kernel_log = "{tmp_path / "kmsg"}"
[kernel_log]
source = "none"
[paths]
db = "{tmp_path / "{node}.db"}"
"""
    )
    return path


def _cfg(path: Path) -> Config:
    return load_config(str(path), env={})


def _busbw(value: float, passed: bool = True) -> ParseResult:
    return ParseResult("nccl", (Measurement(BUSBW, value, "GB/s"),), passed,
                       errors=() if passed else ("#wrong 3",))  # fmt: skip


def _fleet(cfg: Config, model: str = "H100") -> None:
    for node, value in (("n1", 480.0), ("n2", 478.0), ("n3", 360.0)):
        store.ingest(cfg, "nccl", _busbw(value), node=node, gpu_model=model, label="acc",
                     source="test")  # fmt: skip


def _invoke(cfg_path: Path, cmd: Any, *args: str) -> Any:
    return CliRunner().invoke(cmd, list(args), obj=Ctx(str(cfg_path), None, False))


def test_ingest_writes_each_nodes_history_and_rows_reads_them_all(cfg_path: Path) -> None:
    cfg = _cfg(cfg_path)
    _fleet(cfg)
    assert (cfg_path.parent / "n3.db").exists()
    got = store.rows(cfg)
    assert sorted((r["node"], r["value"]) for r in got) == [
        ("n1", 480.0), ("n2", 478.0), ("n3", 360.0)]  # fmt: skip
    assert [r["node"] for r in store.rows(cfg, node="n2")] == ["n2"]
    assert store.rows(cfg, kind="gpuburn") == []


def test_cli_compare_reference_outliers_show(cfg_path: Path) -> None:
    _fleet(_cfg(cfg_path))
    bad = _invoke(cfg_path, baseline, "compare", "n3")
    assert bad.exit_code == 1, bad.output
    assert f"{BUSBW} 360.0 GB/s vs reference 478.0 (-24.7%) FAIL" in bad.output
    good = _invoke(cfg_path, baseline, "compare", "n1", "--json")
    assert good.exit_code == 0 and json.loads(good.output)["status"] == "ok"
    out = _invoke(cfg_path, baseline, "outliers", "--json")
    assert [o["where"] for o in json.loads(out.output)["outliers"]] == ["n3"]
    ref = _invoke(cfg_path, baseline, "reference", "--json")
    assert json.loads(ref.output)["references"][0]["value"] == 478.0
    shown = _invoke(cfg_path, baseline, "show", "--node", "n2", "--json")
    assert [r["node"] for r in json.loads(shown.output)["baselines"]] == ["n2"]


def test_cli_ingest_unreadable_file_is_a_usage_error(cfg_path: Path, tmp_path: Path) -> None:
    from slurmhealth.errors import UsageError

    res = _invoke(cfg_path, baseline, "ingest", "nccl", str(tmp_path / "missing.txt"))
    assert isinstance(res.exception, UsageError) and res.exception.exit_code == 2
    assert "missing.txt" in str(res.exception)


def _standin(tmp_path: Path, text: str) -> str:
    out = tmp_path / "bench-output.txt"
    out.write_text(text)
    script = tmp_path / "bench.py"
    script.write_text(f"import sys\nsys.stdout.write(open({str(out)!r}).read())\n")
    return f"{sys.executable} {script}"


def _with_commands(cfg_path: Path, commands: dict[str, str], pinned: str = "") -> None:
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in commands.items())
    cfg_path.write_text(cfg_path.read_text()
                        + f"[baseline]\nvalidate_commands = {{ {table} }}\n{pinned}")  # fmt: skip


def _fake_parse(kind: str, text: str) -> ParseResult:
    value, _, errors = text.partition(" ")
    return _busbw(float(value), passed=not errors.strip())


def _validate_runs(cfg: Config, node: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(cfg.db_path(node))
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute("select * from check_runs where phase = 'validate'")]


@pytest.mark.parametrize(
    ("output", "status"), [("479", "ok"), ("300", "fail"), ("479 errors", "fail")]
)
def test_validate_runs_checks_and_benchmarks_and_records_the_verdict(
    cfg_path: Path, tmp_path: Path, output: str, status: str
) -> None:
    from slurmhealth.hooks.validate import run_validate

    _fleet(_cfg(cfg_path), SIM_MODEL)  # validate compares with the same GPU model only
    _with_commands(cfg_path, {"nccl": _standin(tmp_path, output)})
    cfg = _cfg(cfg_path)
    result = run_validate(cfg, parse=_fake_parse)
    assert result.status == status, result.reasons
    assert result.check_status == "ok"
    (run,) = _validate_runs(cfg, "n1")
    assert run["status"] == status and run["exit_code"] == result.exit_code
    assert [r["label"] for r in store.rows(cfg, node="n1")] == ["acc", "validate"]
    if status == "fail":
        assert any("nccl" in r for r in result.reasons)


def test_validate_skips_a_benchmark_whose_program_is_missing(cfg_path: Path) -> None:
    from slurmhealth.hooks.validate import run_validate

    _with_commands(cfg_path, {"nccl": "/nonexistent/all_reduce_perf -g 8"})
    cfg = _cfg(cfg_path)
    result = run_validate(cfg, parse=_fake_parse)
    assert result.status == "ok", result.reasons
    (bench,) = result.benchmarks
    assert bench.status == "skipped" and "/nonexistent/all_reduce_perf" in bench.skipped
    assert bench.to_dict()["status"] == "skipped"
    (run,) = _validate_runs(cfg, "n1")
    assert run["status"] == "ok"
    conn = sqlite3.connect(cfg.db_path("n1"))
    (row,) = conn.execute("select severity, message from findings where check_name = ?",
                          ("baseline.nccl",)).fetchall()  # fmt: skip
    assert row[0] == "info" and "command not found" in row[1]


def test_validate_a_program_that_fails_to_run_still_fails(cfg_path: Path, tmp_path: Path) -> None:
    from slurmhealth.hooks.validate import run_validate

    script = tmp_path / "bench.py"
    script.write_text("import sys\nsys.exit(3)\n")
    _with_commands(cfg_path, {"nccl": f"{sys.executable} {script}"})
    result = run_validate(_cfg(cfg_path), parse=_fake_parse)
    assert result.status == "fail" and "exited 3" in " ".join(result.reasons)


def test_validate_cli_reports_progress_on_stderr(
    cfg_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("slurmhealth.baseline.parsers.parse", _fake_parse)
    _fleet(_cfg(cfg_path), SIM_MODEL)
    _with_commands(cfg_path, {"nccl": _standin(tmp_path, "479"),
                              "burn": "/nonexistent/gpu_burn 10"})  # fmt: skip
    runner = CliRunner()
    res = runner.invoke(validate, ["--json"], obj=Ctx(str(cfg_path), None, False))
    out = json.loads(res.stdout)
    assert [b["status"] for b in out["benchmarks"]] == ["ok", "skipped"]
    lines = res.stderr.splitlines()
    assert any(ln.startswith("validate: [1/2] nccl: started") for ln in lines), lines
    assert any(re.match(r"validate: \[1/2\] nccl: ok in \d+\.\d s$", ln) for ln in lines)
    assert "validate: [2/2] burn: SKIPPED: /nonexistent/gpu_burn: command not found" in lines
    quiet = runner.invoke(validate, ["--json"], obj=Ctx(str(cfg_path), None, False, True))
    assert quiet.stderr == ""


def test_validate_cli_checks_only(cfg_path: Path) -> None:
    res = _invoke(cfg_path, validate, "--node", "n7", "--benchmarks", "", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"] == "ok"
    (run,) = _validate_runs(_cfg(cfg_path), "n7")
    assert run["status"] == "ok" and run["node"] == "n7"
    unknown = _invoke(cfg_path, validate, "--benchmarks", "frobnicate")
    assert unknown.exception is not None and "frobnicate" in str(unknown.exception)
