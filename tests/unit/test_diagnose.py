"""Diagnosis rules (rules.toml) and the engine that matches them against a job's Facts."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmhealth.checks.straggler import PEERS_BUSY_PCT, RATIO, stragglers
from slurmhealth.checks.xid_table import classify
from slurmhealth.diagnose import engine
from slurmhealth.diagnose.engine import diagnose, fill, load_rules, verdict
from slurmhealth.diagnose.facts import Diagnosis, Facts, GpuStats, NodeFacts, TaskFacts
from slurmhealth.errors import ConfigError
from slurmhealth.model_records import Job

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
RULES_FILE = Path(engine.__file__).with_name("rules.toml")
SEVERE = ("fail", "critical")


# -- helpers ------------------------------------------------------------------------------------


def event(kind: str, gpu: int | None = None, ts: float = T0, severity: str = "fail", **ev: Any):
    return {"id": 7, "ts": ts, "node": "n1", "job_id": "42", "gpu": gpu, "uuid": None,
            "kind": kind, "severity": severity, "message": f"{kind} on GPU {gpu}",
            "evidence": ev}  # fmt: skip


def xid_event(code: int, gpu: int | None, ts: float = T0) -> dict[str, Any]:
    info = classify(code)
    return event("xid", gpu, ts, info.severity.label, xid=code, name=info.name)


def finding(check: str, gpu: int | None = None, ts: float = T0, severity: str = "fail", **ev: Any):
    return {"id": 3, "run_id": "r1", "ts": ts, "node": "n1", "job_id": "42", "check_name": check,
            "severity": severity, "gpu": gpu, "uuid": None, "message": f"{check} GPU {gpu}",
            "action": "drain", "hint": "", "evidence": ev}  # fmt: skip


def gpus(n: int = 8, util: float = 92.0, **overrides: dict[str, Any]) -> tuple[GpuStats, ...]:
    """``n`` healthy busy GPUs; ``overrides={"3": {...}}`` changes GPU 3's fields."""
    base = {"samples": 60, "util_mean": util, "pcie_width_min": 16, "util_swings": 0}
    return tuple(GpuStats(gpu=i, **{**base, **overrides.get(str(i), {})}) for i in range(n))


def node(name: str = "n1", **kw: Any) -> NodeFacts:
    kw.setdefault("gpus", gpus())
    return NodeFacts(node=name, **kw)


def facts(*nodes: NodeFacts, state: str = "completed", exit_code: str = "0:0") -> Facts:
    nodes = nodes or (node(),)
    names = tuple(n.node for n in nodes)
    job = Job(job_id="42", node_names=names, gpus=tuple(range(8)), start_ts=T0 - 3600,
                   end_ts=T0 + 60, state=state, exit_code=exit_code)  # fmt: skip
    return Facts(job=job, nodes=nodes)


def rules_of(ds: list[Diagnosis]) -> list[str]:
    return [d.rule for d in ds]


def one(ds: list[Diagnosis], rule: str) -> Diagnosis:
    found = [d for d in ds if d.rule == rule]
    assert len(found) == 1, rules_of(ds)
    return found[0]


IB_ERRORS = {"hca": "mlx5_1", "port": 1, "gpus": [2, 3], "failing": ["symbol_error"],
             "gpu_pci_bus_ids": ["0000:3a:00.0", "0000:5d:00.0"]}  # fmt: skip
"""What the ib_errors check's finding (and the sidecar's event) says of a failing port."""

# -- one case per rule: it fires, and no other rule of severity >= fail does ---------------------

CASES: dict[str, Facts] = {
    "gpu_fell_off_bus": facts(node(events=(xid_event(79, 5),))),
    "uncorrectable_memory": facts(node(events=(xid_event(48, 2),))),
    "nvlink_degraded": facts(node(findings=(finding("nvlink_inactive", 3, link=4),))),
    "gsp_timeout": facts(node(events=(xid_event(119, 1),))),
    "thermal_or_power_throttling": facts(
        node(gpus=gpus(**{"4": {"throttle_seconds": {"hw_thermal": 45.0, "hw_slowdown": 30.0}}}))
    ),
    "pcie_downgraded": facts(node(gpus=gpus(**{"6": {"pcie_width_min": 8}}))),
    "straggler_gpu": facts(node(gpus=gpus(**{"7": {"util_mean": 40.0}}))),
    "nccl_socket_fallback": facts(
        node(
            logs={
                "nccl": "n1:2:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"
            }
        ),
        node("n2"),
    ),
    "nccl_sockets_by_choice": facts(
        node(
            logs={
                "nccl": "n1:2:2 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
                "n1:2:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"
            }
        ),
        node("n2"),
    ),
    "straggler_rank": facts(
        node(events=(event("rank_straggler", severity="warn", rank=3, cause="compute"),))
    ),
    "collective_hang": facts(
        node(
            events=(event("hang", None, severity="critical"),),
            logs={"stacks": "Thread 1 (idle): MainThread\n  all_reduce (torch/distributed.py:10)"},
        )
    ),
    "communication_bound": facts(
        node(
            gpus=gpus(util=60.0, **{str(i): {"util_swings": 25} for i in range(8)}),
            events=(event("throughput_drop", severity="warn"),),
        )
    ),
    "data_starvation": facts(
        node(gpus=gpus(util=30.0), task=TaskFacts(steps_total=100, data_wait_ratio=0.45))
    ),
    "stale_process": facts(node(findings=(finding("stale_job", 0, pids=[4242]),))),
    "gpu_init_failed": facts(
        node(findings=(finding("kernel_log", 2, kind="init_failed", line="NVRM: RmInitAdapter"),))
    ),
    "nvswitch_error": facts(
        node(findings=(finding("kernel_log", kind="sxid", level="fatal", code=24007),))
    ),
    "pcie_bus_error": facts(
        node(
            findings=(
                finding("kernel_log", 6, severity="critical", kind="pcie_aer", level="fatal"),
            )
        )
    ),
    "oom_kill": facts(
        node(logs={"kernel": "Out of memory: Killed process 4242 (python) total-vm:1kB"}),
        state="failed",
        exit_code="0:9",
    ),
    "idle_gpus": facts(node(gpus=gpus(util=0.0))),
    "network_degraded": facts(node(findings=(finding("ib_errors", **IB_ERRORS),)), node("n2")),
    "application_error": facts(
        node(logs={"stderr": "Traceback (most recent call last):\nValueError: bad shape"}),
        state="failed",
        exit_code="1:0",
    ),
}


def test_every_rule_has_a_case() -> None:
    assert {r.name for r in load_rules()} == set(CASES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_alone(rule: str) -> None:
    ds = diagnose(CASES[rule])
    d = one(ds, rule)
    assert d.citations, d
    assert "{" not in d.verify + d.action + d.root_cause
    others = [x.rule for x in ds if x.rule != rule and x.severity in SEVERE]
    assert others == []


@pytest.mark.parametrize(
    ("rule", "node_facts", "job_kw"),
    [
        ("gpu_fell_off_bus", node(findings=(finding("gpu_lost", 2, severity="critical"),)), {}),
        ("gpu_fell_off_bus", node(events=(event("gpu_lost", 2, severity="critical"),)), {}),
        ("uncorrectable_memory", node(events=(event("row_remap", 1),)), {}),
        ("uncorrectable_memory", node(findings=(finding("ecc_uncorrectable", 1, volatile=2),)), {}),
        ("nvlink_degraded", node(events=(event("nvlink_down", 0, link=2),)), {}),
        ("nvlink_degraded", node(events=(xid_event(145, 0),)), {}),
        (
            "nvlink_degraded",
            node(logs={"nccl": "n1:5:6 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM"}),
            {},
        ),
        (
            "nvlink_degraded",
            node(
                logs={
                    "nccl": "n1:5:6 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/IB/0\n"
                    "n1:7:8 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via NET/IB/0"
                }
            ),
            {},
        ),
        ("thermal_or_power_throttling", node(events=(event("throttle", 3),)), {}),
        ("thermal_or_power_throttling", node(events=(event("thermal", 3),)), {}),  # sidecar
        ("thermal_or_power_throttling", node(findings=(finding("thermal_margin", 3),)), {}),
        ("pcie_downgraded", node(findings=(finding("pcie_link", 3, severity="warn"),)), {}),
        ("straggler_gpu", node(events=(event("straggler", 6, severity="warn"),)), {}),
        ("collective_hang", node(events=(event("step_stall", None),)), {}),
        (
            "communication_bound",
            node(
                task=TaskFacts(
                    comm_ratio=0.55, samples_per_second_first=900.0, samples_per_second_last=600.0
                )
            ),
            {},
        ),
        (
            "oom_kill",
            node(logs={"stderr": "slurmstepd: error: Detected 1 oom_kill event in StepId=42.0"}),
            {"state": "failed", "exit_code": "0:9"},
        ),
        ("oom_kill", node(), {"state": "out_of_memory", "exit_code": "0:125"}),
        ("application_error", node(), {"state": "completed", "exit_code": "3:0"}),
        (
            "network_degraded",
            node(events=(event("ib_errors", check="ib_errors", **IB_ERRORS),)),
            {},
        ),
        (
            "network_degraded",
            node(findings=(finding("ib_kernel_log", kind="net_module_error", hca="mlx5_1"),)),
            {},
        ),
        ("network_degraded", node(findings=(finding("ib_port_state", hca="mlx5_0", port=1),)), {}),
    ],
)
def test_rule_fires_on_each_symptom(rule: str, node_facts: NodeFacts, job_kw: Any) -> None:
    ds = diagnose(facts(node_facts, **job_kw))
    assert rule in rules_of(ds)
    assert [d.rule for d in ds if d.rule != rule and d.severity in SEVERE] == []


@pytest.mark.parametrize(
    ("node_facts", "job_kw"),
    [
        (node(events=(xid_event(13, 0), xid_event(31, 1))), {}),  # application Xids
        (node(events=(event("xid", 0, severity="info", xid=63),)), {}),  # remap done
        (node(findings=(finding("ecc_uncorrectable", 0, severity="warn", aggregate=1),)), {}),
        (node(gpus=gpus(**{"3": {"util_mean": 10.0}}, util=40.0)), {}),  # peers not busy
        (node(gpus=gpus(**{"3": {"throttle_seconds": {"sw_thermal": 59.0}}})), {}),
        (node(task=TaskFacts(data_wait_ratio=0.5)), {}),  # GPUs busy: not starving
        (node(task=TaskFacts(data_wait_ratio=0.1), gpus=gpus(util=20.0)), {}),
        (node(logs={"stderr": "Killed"}), {"state": "failed", "exit_code": "0:15"}),
        # errors growing, but not yet over the check's window: a warning, not a fault
        (node(findings=(finding("ib_errors", severity="warn", **IB_ERRORS),)), {}),
        # one link flap recorded from the kernel log
        (node(findings=(finding("ib_kernel_log", severity="warn", kind="net_link_down"),)), {}),
    ],
)
def test_no_severe_rule_on_near_misses(node_facts: NodeFacts, job_kw: Any) -> None:
    ds = diagnose(facts(node_facts, **job_kw))
    assert [d.rule for d in ds if d.rule != "application_error"] == []


def test_nccl_via_net_is_normal_across_nodes() -> None:
    log = {"nccl": "NCCL INFO Channel 00 : 0[0] -> 8[0] via NET/IB/0"}
    assert diagnose(facts(node("n1", logs=log), node("n2", logs=log))) == []


def test_xid_95_escalates_and_63_pending_fires() -> None:
    ds = diagnose(facts(node(events=(xid_event(95, 4), event("xid", 2, xid=63)))))
    assert [(d.rule, d.gpu, d.severity) for d in ds] == [
        ("uncorrectable_memory", 4, "critical"),
        ("uncorrectable_memory", 2, "fail"),
    ]


# -- the brief's scenarios ----------------------------------------------------------------------


def test_healthy_completed_job() -> None:
    f = facts(node("n1"), node("n2", logs={"stderr": "step 100 loss 1.2"}))
    ds = diagnose(f)
    assert ds == []
    assert verdict(ds, f) == "no problem found"


def test_failed_job_with_healthy_hardware_is_an_application_error() -> None:
    stderr = "\n".join(f"line {i}" for i in range(20)) + "\nRuntimeError: shapes do not match"
    f = facts(node("n1", logs={"stderr": stderr}), node("n2"), state="failed", exit_code="1:0")
    ds = diagnose(f)
    assert rules_of(ds) == ["application_error"]
    d = ds[0]
    assert (d.severity, d.node, d.gpu) == ("info", None, None)
    kinds = {c.kind: c for c in d.citations}
    assert "state failed, exit 1:0" in kinds["job"].text
    assert kinds["log"].ref == "logs/stderr" and kinds["log"].node == "n1"
    assert kinds["log"].text.endswith("RuntimeError: shapes do not match")
    assert len(kinds["log"].text.splitlines()) == engine.LOG_TAIL_LINES
    assert "sacct -j 42" in d.verify
    assert verdict(ds, f) == "job failed with healthy hardware: application error (see stderr tail)"


def test_xid_79_beats_application_error() -> None:
    drain = {"ts": T0 + 5, "node": "n2", "job_id": "42", "state": "drained", "reason": "x"}
    n2 = node("n2", events=(xid_event(79, 5, ts=T0 + 3),), drains=(drain,), logs={"stderr": "x"})
    f = facts(node("n1"), n2, state="failed", exit_code="0:9")
    ds = diagnose(f)
    assert rules_of(ds) == ["gpu_fell_off_bus"]
    assert (ds[0].node, ds[0].gpu, ds[0].severity) == ("n2", 5, "critical")
    assert verdict(ds, f) == "GPU 5 on n2 fell off the bus (Xid 79) at 22:13:23Z; n2 drained"


def test_citations_point_at_the_matching_rows() -> None:
    lost = finding("gpu_lost", 5, ts=T0 + 10, severity="critical")
    rows = (xid_event(48, 1, ts=T0 + 1), xid_event(79, 5, ts=T0 + 2), event("hang", None))
    ds = diagnose(facts(node("n2", events=rows, findings=(lost,))))
    d = one(ds, "gpu_fell_off_bus")
    got = [(c.kind, c.node, c.gpu, c.ts) for c in d.citations]
    assert got == [("event", "n2", 5, T0 + 2), ("finding", "n2", 5, T0 + 10)]
    assert d.citations[0].text.startswith("xid: ") and d.citations[0].ref == "events/7"
    assert one(ds, "uncorrectable_memory").citations[0].ts == T0 + 1
    assert one(ds, "collective_hang").gpu is None
    assert rules_of(ds)[:2] == ["gpu_fell_off_bus", "collective_hang"]  # critical, by confidence


def test_one_diagnosis_per_gpu_and_node_level_hits_cited_in_each() -> None:
    n = node(
        events=(event("nvlink_down", 1), event("nvlink_down", 2), event("nvlink_down", 2)),
        logs={
            "nccl": "n1:5:6 [0] NCCL INFO P2P is disabled between NVLINK connected GPUs 1 and "
            "2. This should not be the case given their connectivity, and is probably due to a "
            "hardware issue. If you still want to proceed, you can set NCCL_IGNORE_DISABLED_P2P=1."
        },
    )
    ds = diagnose(facts(n))
    assert [(d.rule, d.gpu, len(d.citations)) for d in ds] == [
        ("nvlink_degraded", 1, 2),
        ("nvlink_degraded", 2, 2),  # the two identical rows are one citation
    ]
    assert all(d.citations[-1].kind == "log" for d in ds)


def test_placeholders_filled() -> None:
    f = facts(node("gpu-n7", events=(xid_event(64, 3),)))
    ds = diagnose(f)
    d = one(ds, "uncorrectable_memory")
    assert "-i 3" in d.verify and "on gpu-n7:" in d.verify
    assert "(Xid 64)" in d.root_cause and "drain gpu-n7" in d.action
    assert verdict(ds, f) == "uncorrectable memory error on GPU 3 on gpu-n7 (Xid 64) at 22:13:20Z"
    assert verdict(ds, facts()) == "uncorrectable memory error on GPU 3 on gpu-n7 at 22:13:20Z"


def test_fill() -> None:
    v = {"gpu": "3", "node": "n1", "xid": None}
    assert fill("GPU {gpu} on {node}{? (Xid {xid})}", v) == "GPU 3 on n1"
    assert fill("{?GPU {gpu} }on {node}", v) == "GPU 3 on n1"
    assert fill("Xid {xid} {nope}", v) == "Xid <xid> <nope>"
    assert fill("grep -E 'a{2}' {", v) == "grep -E 'a{2}' {"


def test_verdict_counts_other_problems() -> None:
    n = node(events=(xid_event(79, 5), xid_event(119, 1), event("straggler", 2, severity="warn")))
    f = facts(n)
    assert (
        verdict(diagnose(f), f)
        == "GPU 5 on n1 fell off the bus (Xid 79) at 22:13:20Z; 1 more problem; 1 warning"
    )


def test_failed_job_headline_is_the_application_error_despite_warnings() -> None:
    n = node(events=(event("throttle", 3), event("straggler", 2, severity="warn")))
    f = facts(n, state="failed", exit_code="2:0")
    ds = diagnose(f)
    assert rules_of(ds) == ["thermal_or_power_throttling", "straggler_gpu", "application_error"]
    assert verdict(ds, f) == (
        "job failed with healthy hardware: application error (see stderr tail); 2 warnings"
    )


def test_job_level_rule_without_nodes() -> None:
    f = Facts(job=Job(job_id="9", state="FAILED", exit_code="1:0"))
    ds = diagnose(f)
    assert [(d.rule, d.node, d.gpu) for d in ds] == [("application_error", None, None)]
    assert ds[0].citations[0].text == "job 9: state failed, exit 1:0"


def test_gpu_lost_without_xid_leaves_the_xid_out_of_the_verdict() -> None:
    f = facts(node(findings=(finding("gpu_lost", 2, ts=T0, severity="critical"),)))
    assert verdict(diagnose(f), f) == "GPU 2 on n1 fell off the bus at 22:13:20Z"


# -- the rules file -----------------------------------------------------------------------------


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = RULES_FILE.read_text()
    assert old in text
    path = tmp_path / "rules.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("{ xid = { code = [79] } }", "{ bogus = { code = [79] } }", "rule[0].when.any[0].bogus"),
        (
            "{ xid = { code = [79] } }",
            "{ xid = { codes = [79] } }",
            "rule[0].when.any[0].xid.codes",
        ),
        ('severity = "critical"', 'severity = "dire"', "rule[0].severity"),
        ("confidence = 0.95", "confidence = 1.5", "rule[0].confidence"),
        ('name = "uncorrectable_memory"', 'name = "gpu_fell_off_bus"', "rule[1].name"),
        (
            'field = "util_mean", straggler',
            'field = "util_avg", straggler',
            "rule[6].when.any[1].gpu_stat.field",
        ),
        (
            'field = "util_mean", straggler = true',
            'field = "util_mean", straggler = false',
            "rule[6].when.any[1].gpu_stat.straggler",
        ),
        (
            'pattern = "Out of memory',
            'pattern = "(Out of memory',
            "rule[11].when.any[0].log.pattern",
        ),
        ("escalate = true", 'escalate = "yes"', "rule[1].escalate"),
        (
            "{ job = { nodes_at_most = 1 } }",
            "{ job = { nodes_at_most = true } }",
            "rule[18].when.all[1].not.job.nodes_at_most",
        ),
    ],
)
def test_bad_rules_file_names_rule_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    path = _broken(tmp_path, old, new)
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    assert err.value.key == key
    assert err.value.source == str(path) and key in str(err.value)


def test_rules_file_missing_when_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rule\[10\]\.when: missing"):
        load_rules(_broken(tmp_path, 'when = { finding = { check = ["stale_job"] } }', ""))
    (tmp_path / "bad.toml").write_text("[[rule]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_rules(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_rules(tmp_path / "missing.toml")


def test_custom_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rule]]\nname = "hot"\ntitle = "Hot"\nseverity = "warn"\n'
        'root_cause = "{field} on {where}"\nverify = "v"\naction = "a"\nconfidence = 0.4\n'
        'fault_class = "system"\nuser_action = "u"\n'
        'when = { gpu_stat = { field = "temp_max_c", agg = "max", above = 85 },'
        ' not = { event = { kind = ["throttle"] } } }\n'
    )
    rules = load_rules(path)
    hot = node(gpus=gpus(**{"1": {"temp_max_c": 91.0}}))
    ds = diagnose(facts(hot), rules)
    assert [(d.rule, d.node, d.gpu, d.root_cause) for d in ds] == [
        ("hot", "n1", None, "temp_max_c on n1")
    ]
    assert diagnose(facts(node(gpus=hot.gpus, events=(event("throttle", 1),))), rules) == []
    assert verdict(ds, facts(hot), rules) == "Hot (n1)"


# -- robustness and speed -----------------------------------------------------------------------

_odd = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(
        [
            "xid",
            "gpu_lost",
            "hang",
            "fail",
            "critical",
            "79",
            "0:9",
            "1e400",
            25,
            40,
            "ecc",
            "row_remap",
            "stale_job",
        ]
    ),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["xid", "a"]), st.integers() | st.text(max_size=3)),
)
_row = st.dictionaries(
    st.sampled_from(
        [
            "id",
            "ts",
            "gpu",
            "kind",
            "check_name",
            "severity",
            "severity_value",
            "message",
            "evidence",
            "node",
            "state",
        ]
    ),
    _odd,
)
_gpu = st.builds(
    GpuStats,
    gpu=_odd,
    util_mean=_odd,
    util_swings=_odd,
    pcie_width_min=_odd,
    throttle_seconds=st.one_of(_odd, st.dictionaries(st.text(max_size=3), _odd)),
)
_task = st.one_of(st.none(), st.builds(TaskFacts, comm_ratio=_odd, data_wait_ratio=_odd,
                                       samples_per_second_first=_odd))  # fmt: skip
_node = st.builds(
    NodeFacts,
    node=st.text(max_size=4),
    findings=st.lists(_row, max_size=4).map(tuple),
    events=st.lists(_row, max_size=4).map(tuple),
    drains=st.lists(_row, max_size=2).map(tuple),
    gpus=st.lists(_gpu, max_size=4).map(tuple),
    task=_task,
    logs=st.dictionaries(st.sampled_from(["stderr", "nccl", "kernel", "stacks"]), _odd),
)
_job = st.builds(Job, job_id=_odd, state=_odd, exit_code=_odd, node_names=_odd.map(lambda x: ()))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.builds(Facts, job=_job, nodes=st.lists(_node, max_size=3).map(tuple)))
def test_diagnose_never_raises(f: Facts) -> None:
    ds = diagnose(f)
    line = verdict(ds, f)
    assert isinstance(line, str) and line
    assert all(d.severity in ("info", "warn", "fail", "critical") for d in ds)
    assert all(not math.isnan(d.confidence) for d in ds)


def test_thousands_of_rows() -> None:
    """4,000 events/findings (most of them matching a rule) and 4,000 log lines."""
    kinds = ["throttle", "straggler", "nvlink_errors", "ecc", "hang", "xid"]
    checks = ["clock_events", "pcie_link", "nvlink_errors", "xid", "stale_job", "persistence_mode"]
    nodes = tuple(
        node(
            f"n{k}",
            events=tuple(
                event(kinds[i % 6], i % 8, T0 + i, xid=(13, 79, 48)[i % 3]) for i in range(1200)
            ),
            findings=tuple(finding(checks[i % 6], i % 8, T0 + i, xid=31) for i in range(800)),
            logs={"kernel": "\n".join(f"kernel line {i}" for i in range(2000))},
        )
        for k in range(2)
    )
    f = facts(*nodes, state="failed", exit_code="1:0")
    ds = diagnose(f)
    assert verdict(ds, f)
    assert len(ds) > 20
    assert all(len(d.citations) <= engine.MAX_CITATIONS for d in ds)
    # speed is measured by benchmarks/report_latency.py, not by a timed test


# -- one straggler rule: the diagnosis, the report and the sidecar agree ------------------------


@pytest.mark.parametrize(
    ("share", "peers", "slow"),
    [
        (RATIO - 0.01, 92.0, True),  # just below the ratio of busy peers' median
        (RATIO + 0.01, 92.0, False),
        (0.2, 40.0, False),  # peers not busy (PEERS_BUSY_PCT): the job was not running
    ],
)
def test_report_and_diagnosis_judge_stragglers_by_the_sidecars_rule(
    share: float, peers: float, slow: bool
) -> None:
    from slurmhealth.report.build import _stragglers

    f = facts(node(gpus=gpus(util=peers, **{"7": {"util_mean": share * peers}})))
    assert ("straggler_gpu" in rules_of(diagnose(f))) is slow
    assert [(s.node, s.gpu) for s in _stragglers(f, RATIO)] == ([("n1", 7)] if slow else [])
    assert [s.gpu for s in stragglers({g.gpu: g.util_mean or 0.0 for g in f.nodes[0].gpus},
                                      RATIO, PEERS_BUSY_PCT)] == ([7] if slow else [])  # fmt: skip


def test_report_stragglers_compare_gpus_across_the_jobs_nodes() -> None:
    from slurmhealth.report.build import _stragglers

    slow_node = node("n2", gpus=gpus(n=2, util=92.0, **{"1": {"util_mean": 50.0}}))
    f = facts(node("n1", gpus=gpus(n=2, util=92.0)), slow_node)
    (s,) = _stragglers(f, RATIO)
    assert (s.node, s.gpu, s.util_mean, s.peer_median, s.source) == ("n2", 1, 50.0, 92.0, "stats")
    assert _stragglers(f, 0.5) == []  # the site's sidecar.straggler_ratio decides


def test_a_straggler_rank_is_named_with_its_node_in_the_verdict_and_the_steps() -> None:
    ev = event("rank_straggler", severity="warn", rank=3, cause="data")
    f = facts(node(events=(ev,)))
    d = one(diagnose(f), "straggler_rank")
    assert engine.verdict([d], f).startswith("rank 3 on n1 is the straggler")
    assert "(data)" in d.root_cause and "rank 3" in d.user_action


def test_sockets_between_nodes_are_flagged_but_not_on_a_single_node_job() -> None:
    line = "n1:2:9 [0] NCCL INFO Using network Socket"
    two = facts(node(logs={"nccl": line}), node("n2"))
    d = one(diagnose(two), "nccl_socket_fallback")
    assert (d.fault_class, d.node) == ("system", "n1") and "--exclude=n1" in d.user_action
    assert "nccl_socket_fallback" not in rules_of(diagnose(facts(node(logs={"nccl": line}))))


def test_a_kernel_line_from_before_the_job_is_not_the_jobs_fault() -> None:
    """The bundle's kernel log is the log's tail: the previous job's Xid 79 in it must not
    make this job's verdict; the same line during the job does."""

    def with_line(offset_s: float) -> Facts:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(T0 - 3600 + offset_s))
        xid = "NVRM: Xid (PCI:0000:ab:00): 79, pid=1, name=p, GPU has fallen off the bus."
        line = f"{stamp}.5+00:00 n1 kernel: {xid}"
        return facts(node(logs={"kernel": line}))

    assert "gpu_fell_off_bus" not in rules_of(diagnose(with_line(-60)))  # a minute before
    assert "gpu_fell_off_bus" in rules_of(diagnose(with_line(+60)))  # during the job


def test_a_degraded_port_names_the_network_the_hca_and_the_gpus_behind_it() -> None:
    f = facts(
        node("n1"),
        node("n2", events=(event("ib_errors", check="ib_errors", **IB_ERRORS),),
             findings=(finding("ib_errors", **IB_ERRORS),)),
    )  # fmt: skip
    ds = diagnose(f)
    d = one(ds, "network_degraded")
    assert (d.node, d.fault_class, len(d.citations)) == ("n2", "system", 2)
    assert verdict(ds, f).startswith(
        "network degraded on n2: mlx5_1/1 ib_errors (symbol_error) (GPUs 2,3 behind it)"
    )
    assert "GPUs 2,3" in d.root_cause and "InfiniBand/RoCE port mlx5_1/1" in d.root_cause
    assert "--exclude=n2" in d.user_action and "not your code" in d.user_action
    assert "ib_write_bw" in d.action and "perfquery" in d.verify
