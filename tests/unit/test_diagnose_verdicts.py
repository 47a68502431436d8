"""The report's one-line verdict and the order of diagnoses, as a reader sees them: the
headline, the nodes left drained, how many other problems and warnings, the time of the
first evidence, and the rules the caller passed (not the packaged ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurmhealth.diagnose.engine import diagnose, load_rules, verdict
from slurmhealth.diagnose.facts import Facts, NodeFacts
from tests.unit.test_diagnose import RULES_FILE, T0, facts, finding, gpus, node, xid_event


def drain(name: str, state: str = "drained", ts: float = T0) -> dict[str, Any]:
    return {"id": 1, "ts": ts, "node": name, "job_id": "42", "state": state,
            "reason": "slurmhealth: xid", "actor": "prolog"}  # fmt: skip


def lost(name: str, gpu: int, ts: float, **kw: Any) -> NodeFacts:
    return node(name, events=(xid_event(79, gpu, ts=ts),), **kw)


def test_the_verdict_names_the_first_problem_the_drained_nodes_and_counts_the_rest() -> None:
    f = facts(
        node("n1", findings=(finding("xid", 3, ts=T0 + 5, xid=79),), drains=(drain("n1"),)),
        lost("n2", 2, T0 + 9, drains=(drain("n2"),)),
        lost("n3", 1, T0 + 7),
        node("n4", gpus=gpus(8, **{"2": {"pcie_width_min": 8}})),
    )
    assert verdict(diagnose(f), f) == (
        "GPU 3 on n1 fell off the bus (Xid 79) at 22:13:25Z; n1, n2 drained; "
        "2 more problems; 1 warning"
    )


def test_one_more_problem_and_two_warnings_are_counted_in_the_singular_and_plural() -> None:
    slow = {"2": {"pcie_width_min": 8}}
    f = facts(lost("n1", 0, T0), lost("n2", 0, T0 + 1), node("n3", gpus=gpus(8, **slow)),
              node("n4", gpus=gpus(8, **slow)))  # fmt: skip
    assert verdict(diagnose(f), f).endswith("; 1 more problem; 2 warnings")


def test_a_node_resumed_after_its_drain_is_not_left_drained() -> None:
    rows = (drain("n1", ts=T0), drain("n1", "resumed", ts=T0 + 60))
    f = facts(lost("n1", 0, T0, drains=rows), lost("n2", 1, T0 + 1, drains=(drain("n2"),)))
    assert "; n2 drained;" in verdict(diagnose(f), f)
    again = (*rows, drain("n1", "already", ts=T0 + 120))
    f = facts(lost("n1", 0, T0, drains=again))
    assert verdict(diagnose(f), f).endswith("; n1 drained")
    f = facts(lost("n1", 0, T0, drains=(drain("n1", "suppressed"),)))
    assert "drained" not in verdict(diagnose(f), f)  # the breaker held it: not drained


def test_a_job_level_diagnosis_is_the_jobs_nodes() -> None:
    f = facts(node("n1"), node("n2"), state="out_of_memory", exit_code="0:9")
    [oom] = diagnose(f)
    assert (oom.rule, oom.node) == ("oom_kill", None)
    assert verdict([oom], f) == "job killed for running out of host memory on n1, n2 at 22:14:20Z"


def test_an_unprintable_time_leaves_the_at_out() -> None:
    f = facts(lost("n1", 0, 1e300))
    assert verdict(diagnose(f), f) == "GPU 0 on n1 fell off the bus (Xid 79)"
    assert verdict([], f) == "no problem found"


def test_evidence_times_give_the_first_and_last_and_cite_in_order() -> None:
    events = (xid_event(79, 4, ts=T0 + 9), xid_event(79, 4, ts=T0 + 1), xid_event(79, 4, ts=T0 + 5))
    [d] = diagnose(facts(node("n1", events=events)))
    assert (d.first_ts, d.last_ts) == (T0 + 1, T0 + 9)
    stamps = [c.ts for c in d.citations if c.ts is not None]
    assert stamps == sorted(stamps) and stamps[0] == T0 + 1


def test_diagnoses_sort_by_severity_confidence_node_gpu_and_rule() -> None:
    f = facts(
        lost("n2", 0, T0),
        node("n10", events=(xid_event(79, 3, ts=T0), xid_event(79, 1, ts=T0))),
        node("n3", gpus=gpus(8, **{"5": {"pcie_width_min": 8}})),
    )
    order = [(d.rule, d.node, d.gpu) for d in diagnose(f)]
    assert order == [
        ("gpu_fell_off_bus", "n10", 1),  # by node name as text: "n10" < "n2"
        ("gpu_fell_off_bus", "n10", 3),
        ("gpu_fell_off_bus", "n2", 0),
        ("pcie_downgraded", "n3", 5),
    ]


def test_a_node_level_diagnosis_comes_before_its_gpus() -> None:
    stats = gpus(8, util=1.0)  # idle_gpus is node-level (gpu None)
    f = facts(node("n1", gpus=stats, events=(xid_event(79, 0, ts=T0),)))
    warn_first = [(d.rule, d.gpu) for d in diagnose(f) if d.severity == "warn"]
    assert warn_first == [("idle_gpus", None)]
    f = facts(node("n1", gpus=gpus(8, **{"0": {"pcie_width_min": 8}, "4": {"pcie_width_min": 4}})))
    assert [d.gpu for d in diagnose(f)] == [0, 4]


def test_the_verdict_uses_the_rules_it_is_given(tmp_path: Path) -> None:
    text = RULES_FILE.read_text().replace(
        'verdict = "{where} fell off the bus{? (Xid {xid})}{at}"',
        'verdict = "{where} is gone{at}"',
    )
    custom = tmp_path / "rules.toml"
    custom.write_text(text)
    rules = load_rules(custom)
    f: Facts = facts(lost("n1", 6, T0))
    ds = diagnose(f, rules)
    assert verdict(ds, f, rules) == "GPU 6 on n1 is gone at 22:13:20Z"
    assert verdict(ds, f) == "GPU 6 on n1 fell off the bus (Xid 79) at 22:13:20Z"


def test_the_newest_drains_row_decides_whatever_order_the_rows_come_in() -> None:
    resumed_later = (drain("n1", "resumed", ts=T0 + 60), drain("n1", ts=T0))
    f = facts(lost("n1", 0, T0, drains=resumed_later))
    assert "drained" not in verdict(diagnose(f), f)
    unnamed = {k: v for k, v in drain("n1").items() if k != "node"}  # the row's node: its own
    f = facts(lost("n1", 0, T0, drains=(unnamed,)))
    assert verdict(diagnose(f), f).endswith("; n1 drained")
    untimed = (drain("n1", ts=T0 + 60), {**drain("n1", "resumed"), "ts": True})
    f = facts(lost("n1", 0, T0, drains=untimed))  # a bool is no time: counts as oldest
    assert verdict(diagnose(f), f).endswith("; n1 drained")
