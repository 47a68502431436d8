"""What a diagnosis tells the job's owner and the admins: every rule says whose fault it is
(hardware, system, application, unknown) and gives both a user's and an admin's next step."""

from __future__ import annotations

import re

import pytest

from slurmhealth.diagnose.engine import diagnose, headline, load_rules
from slurmhealth.diagnose.rules import FAULT_CLASSES
from tests.unit.test_diagnose import CASES

ADMIN_ONLY = ("nvidia-smi -r", "RMA", "reboot", "reseat")  # steps a user cannot take


def test_every_rule_has_a_fault_class_and_both_actions() -> None:
    rules = load_rules()
    assert len(rules) >= 15
    for r in rules:
        assert r.fault_class in FAULT_CLASSES, r.name
        assert len(r.user_action) > 20 and len(r.admin_action) > 20, r.name
        assert r.user_action != r.admin_action, r.name
        assert not any(word in r.user_action for word in ADMIN_ONLY), (r.name, r.user_action)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_filled_texts_name_the_node_and_whose_fault(rule: str) -> None:
    d = next(d for d in diagnose(CASES[rule]) if d.rule == rule)
    texts = d.user_action + d.admin_action
    assert "{" not in texts and not re.search(r"<[a-z_]+>", texts)  # every placeholder known
    assert d.fault_class in FAULT_CLASSES and d.count >= 1
    if d.fault_class == "hardware":  # the owner hears first that it was not their code
        assert d.user_action.startswith("not your code"), d.user_action
        assert "--exclude=n1" in d.user_action
    if d.fault_class == "application":
        assert "not your code" not in d.user_action


def test_headline_is_what_the_verdict_names() -> None:
    ds = diagnose(CASES["gpu_fell_off_bus"])
    top = headline(ds)
    assert top is not None and (top.rule, top.fault_class) == ("gpu_fell_off_bus", "hardware")
    assert headline([]) is None
    idle = headline(diagnose(CASES["idle_gpus"]))
    assert idle is not None and (idle.rule, idle.fault_class) == ("idle_gpus", "application")
