from __future__ import annotations

import pytest

from slurmhealth.checks.xid_table import XID_TABLE, XidInfo, classify
from slurmhealth.model import Action, Severity

ACTING = [48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140, *range(144, 151), 154]
RESET = [79, 94, 95, 119, 120]
APPLICATION = [13, 31, 43, 45, 68]


def test_79_is_critical_reset() -> None:
    info = classify(79)
    assert (info.xid, info.severity, info.action) == (79, Severity.CRITICAL, Action.RESET)
    assert "fallen off the bus" in info.name
    assert "nvidia-smi -r" in info.hint


@pytest.mark.parametrize("xid", ACTING)
def test_acting_xids_act(xid: int) -> None:
    info = classify(xid)
    assert info.xid == xid
    assert info.severity >= Severity.FAIL
    assert info.action in (Action.DRAIN, Action.RESET)
    assert info.acts
    assert info.hint and "\n" not in info.hint


@pytest.mark.parametrize("xid", RESET)
def test_reset_xids(xid: int) -> None:
    assert classify(xid).action is Action.RESET


@pytest.mark.parametrize("xid", APPLICATION)
def test_application_xids_are_recorded(xid: int) -> None:
    info = classify(xid)
    assert (info.severity, info.action, info.acts) == (Severity.INFO, Action.RECORD, False)


def test_63_depends_on_remap_pending() -> None:
    pending = classify(63, remap_pending=True)
    assert pending.severity >= Severity.FAIL and pending.acts
    done = classify(63, remap_pending=False)
    assert (done.severity, done.action) == (Severity.INFO, Action.RECORD)
    unknown = classify(63)
    assert unknown.action is Action.RECORD and not unknown.acts
    assert "ROW_REMAPPER" in unknown.hint


def test_remap_pending_only_matters_for_63() -> None:
    assert classify(79, remap_pending=True) == classify(79)
    assert classify(13, remap_pending=True) == classify(13)


@pytest.mark.parametrize("xid", [0, 1, 9999, 12345, -5])
def test_unknown_xid_is_warn_record(xid: int) -> None:
    info = classify(xid)
    assert (info.xid, info.severity, info.action) == (xid, Severity.WARN, Action.RECORD)
    assert "Xid catalog" in info.hint and str(xid) in info.hint


def test_table_is_consistent_and_read_only() -> None:
    for xid, info in XID_TABLE.items():
        assert isinstance(info, XidInfo) and info.xid == xid
        assert info.name and info.hint and "\n" not in info.hint
        assert info.acts == (info.severity >= Severity.FAIL)
    assert 63 not in XID_TABLE  # state-dependent, see classify()
    with pytest.raises(TypeError):
        XID_TABLE[1] = classify(79)  # type: ignore[index]
