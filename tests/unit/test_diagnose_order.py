"""The diagnosis engine's texts and order over a rules file of the caller's: placeholders of
several hits, unknown GPUs, the job as the place, citations in time order, ties in the
report's order, the headline and verdict by the caller's rules, the drained nodes' names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurmhealth.diagnose.engine import diagnose, headline, load_rules, verdict
from slurmhealth.diagnose.facts import Facts
from slurmhealth.diagnose.rules import Rule
from slurmhealth.model_records import Job
from tests.unit.test_diagnose import T0, facts, finding, node


def _rule(name: str, when: str, severity: str = "fail", confidence: float = 0.5,
          text: str = "{where}", extra: str = "") -> str:  # fmt: skip
    return f"""
[[rule]]
name = "{name}"
title = "{name} title"
severity = "{severity}"
confidence = {confidence}
root_cause = "{text}"
verify = "v"
fault_class = "hardware"
user_action = "u"
admin_action = "a"
when = {when}
{extra}"""


def _rules(tmp_path: Path, *rules: str) -> list[Rule]:
    path = tmp_path / "rules.toml"
    path.write_text("".join(rules))
    return load_rules(path)


def _check(*names: str) -> str:
    return "{ finding = { check = [" + ", ".join(f'"{n}"' for n in names) + "] } }"


def test_a_placeholder_of_several_hits_lists_each_value_once(tmp_path: Path) -> None:
    rules = _rules(tmp_path, _rule("mem", _check("ecc_uncorrectable", "row_remap"), text="{check}"))
    f = facts(node(findings=(finding("ecc_uncorrectable", 2), finding("row_remap", 2),
                             finding("ecc_uncorrectable", 2, ts=T0 + 1))))  # fmt: skip
    [d] = diagnose(f, rules)
    assert d.root_cause == "ecc_uncorrectable, row_remap"


def test_a_node_level_diagnosis_has_no_gpu_to_name(tmp_path: Path) -> None:
    rules = _rules(tmp_path, _rule("r", _check("driver_version"), text="on {where}{? GPU {gpu}}"))
    [d] = diagnose(facts(node(findings=(finding("driver_version", None),))), rules)
    assert (d.gpu, d.root_cause) == (None, "on n1")


def test_a_job_without_node_facts_is_the_place(tmp_path: Path) -> None:
    rules = _rules(tmp_path, _rule("oom", '{ job = { state = ["out_of_memory"] } }'))
    f = Facts(job=Job(job_id="42", state="out_of_memory", end_ts=T0), nodes=())
    [d] = diagnose(f, rules)
    assert (d.node, d.root_cause) == (None, "the job")
    assert verdict([d], f, rules) == "oom title (the job) at 22:13:20Z"


def test_citations_are_in_time_order_unknown_times_last(tmp_path: Path) -> None:
    rules = _rules(tmp_path, _rule("r", _check("zeta", "alpha", "mid")))
    rows = (finding("alpha", 1, ts=T0 + 5), finding("mid", 1, ts=None), finding("zeta", 1, ts=T0))
    [d] = diagnose(facts(node(findings=rows)), rules)
    assert [c.text.split(":")[0] for c in d.citations] == ["zeta", "alpha", "mid"]
    assert (d.count, d.first_ts, d.last_ts) == (3, T0, T0 + 5)


def test_ties_are_ordered_by_node_then_gpu_then_rule(tmp_path: Path) -> None:
    """Same severity and confidence: the job before its nodes, a node before its GPUs."""
    rules = _rules(
        tmp_path,
        _rule("a_gpu", _check("gpu_check")),
        _rule("z_node", _check("node_check")),
        _rule("m_job", '{ job = { state = ["failed"] } }'),
    )
    f = facts(node("DGX01", findings=(finding("gpu_check", 0), finding("node_check", None))),
              state="failed")  # fmt: skip
    assert [(d.rule, d.node, d.gpu) for d in diagnose(f, rules)] == [
        ("m_job", None, None), ("z_node", "DGX01", None), ("a_gpu", "DGX01", 0)
    ]  # fmt: skip


def test_the_headline_and_verdict_follow_the_callers_rules(tmp_path: Path) -> None:
    """A rule of the caller's with suppressed_by that held is the headline, though another
    is more confident: the packaged rules do not know it."""
    rules = _rules(
        tmp_path,
        _rule("app_crash", '{ job = { state = ["failed"] } }', severity="warn",
              extra='suppressed_by = "fail"\nverdict = "the application crashed"'),
        _rule("hot_gpu", _check("thermal_margin"), severity="warn", confidence=0.9),
    )  # fmt: skip
    f = facts(node(findings=(finding("thermal_margin", 3, severity="warn"),)), state="failed")
    ds = diagnose(f, rules)
    assert [d.rule for d in ds] == ["hot_gpu", "app_crash"]
    top = headline(ds, rules)
    assert top is not None and top.rule == "app_crash"
    assert verdict(ds, f, rules) == "the application crashed; 1 warning"


def test_a_diagnosis_of_a_rule_no_longer_known_is_named_by_its_title(tmp_path: Path) -> None:
    rules = _rules(tmp_path, _rule("gone", _check("gpu_check")))
    f = facts(node(findings=(finding("gpu_check", 4, ts=T0 + 2),)))
    assert verdict(diagnose(f, rules), f, rules=[]) == "gone title (GPU 4 on n1) at 22:13:22Z"


def test_a_fail_beside_a_critical_headline_is_one_more_problem(tmp_path: Path) -> None:
    rules = _rules(
        tmp_path,
        _rule("lost", _check("gpu_lost"), severity="critical"),
        _rule("mem", _check("ecc_uncorrectable"), severity="fail"),
        _rule("hot", _check("thermal_margin"), severity="warn"),
    )
    f = facts(node(findings=(finding("gpu_lost", 1), finding("ecc_uncorrectable", 2),
                             finding("thermal_margin", 3))))  # fmt: skip
    assert verdict(diagnose(f, rules), f, rules).endswith("; 1 more problem; 1 warning")


@pytest.mark.parametrize(("row_node", "drained"), [("n2", ["n2"]), (None, ["n1"])])
def test_the_node_left_drained_is_the_one_its_row_names(
    tmp_path: Path, row_node: str | None, drained: list[str]
) -> None:
    rules = _rules(tmp_path, _rule("lost", _check("gpu_lost"), severity="critical"))
    row: dict[str, Any] = {"id": 1, "ts": T0, "node": row_node, "state": "drained"}
    f = facts(node(findings=(finding("gpu_lost", 1),), drains=(row,)))
    assert verdict(diagnose(f, rules), f, rules).endswith(f"; {', '.join(drained)} drained")
