from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from slurmhealth.checks.xid_table import BUCKETS, XID_TABLE, XidInfo, classify, explain, judge
from slurmhealth.kernel_log import parse_xid
from slurmhealth.model import Action, Severity, XidEvent

ACTING = [46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, *range(144, 151)]
ACTING += [154, 155, 156, 158]
RESET = [62, 64, 79, 95, 109, 119, 120, 140]
APPLICATION = [8, 13, 31, 43, 44, 45, 68, 69, 126, 135]
# Xids the catalog says not to act on: recorded (a few as warnings), never drained
NEVER_DRAIN = [*APPLICATION, 14, 32, 38, 56, 57, 58, 61, 63, 92, 94, 121, 137, 157]

# The driver's own verdicts, in the form NVIDIA's memory error management guide documents.
CONTAINED_94 = (
    "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, "
    "Contained: SM (0x1). RST: No, D-RST: No"
)
CONTAINED_94_MIG = (
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
    "RST: No, D-RST: No"
)
UNCONTAINED_95 = (
    "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No"
)


def event(line: str) -> XidEvent:
    ev = parse_xid(line)
    assert ev is not None
    return ev


def test_79_reboots_the_node() -> None:
    info = classify(79)
    assert (info.xid, info.severity, info.action) == (79, Severity.CRITICAL, Action.RESET)
    assert "fallen off the bus" in info.name
    assert info.immediate == "RESTART_BM" and "reboot" in info.hint


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


@pytest.mark.parametrize("xid", NEVER_DRAIN)
def test_catalog_non_actions_never_drain(xid: int) -> None:
    info = classify(xid)
    assert not info.acts and info.severity <= Severity.WARN


def test_109_is_known() -> None:
    info = classify(109)
    assert info.name != "unknown Xid" and "context switch" in info.name.lower()
    assert (info.immediate, info.action) == ("RESET_GPU", Action.RESET)


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
        assert info.immediate in BUCKETS and info.mnemonic
        assert f"Xid {xid} {info.mnemonic}" in info.source  # a source note per row
    assert 63 not in XID_TABLE  # state-dependent, see classify()
    with pytest.raises(TypeError):
        XID_TABLE[1] = classify(79)  # type: ignore[index]


def test_catalog_file_rows_all_name_a_bucket_and_a_source() -> None:
    text = resources.files("slurmhealth.checks").joinpath("xid_catalog.toml").read_text()
    data = tomllib.loads(text)
    assert len(data["xid"]) >= 100
    for key, row in data["xid"].items():
        assert row["immediate"] in data["bucket"], key
        assert row["source"].startswith(f"catalog Xid {key} "), key


# -- the driver's verdict overrides the table ---------------------------------------------
@pytest.mark.parametrize("line", [CONTAINED_94, CONTAINED_94_MIG])
def test_contained_94_warns_and_never_drains(line: str) -> None:
    info = judge(event(line), remap_pending=True)
    assert (info.severity, info.action, info.basis) == (Severity.WARN, Action.RECORD, "driver")
    assert not info.acts and "row-remap" in info.hint


def test_94_without_driver_fields_still_does_not_drain() -> None:
    info = judge(event("NVRM: Xid (PCI:0000:00:08): 94, pid=12, name=python, Ch 00000008"))
    assert not info.acts and info.basis == "catalog"


def test_uncontained_95_resets() -> None:
    info = judge(event(UNCONTAINED_95))
    assert (info.severity, info.action, info.basis) == (Severity.CRITICAL, Action.RESET, "driver")
    assert classify(95).action is Action.RESET  # and without the fields too


def test_d_rst_yes_drains_and_resets() -> None:
    line = "NVRM: Xid (PCI:0000:01:00): 94, pid=1, Contained: SM (0x1). RST: No, D-RST: Yes"
    info = judge(event(line))
    assert (info.severity, info.action) == (Severity.CRITICAL, Action.RESET)
    assert "D-RST" in info.hint


def test_rst_yes_on_a_contained_error_resets() -> None:
    line = "NVRM: Xid (PCI:0000:01:00): 94, pid=1, Contained: SM (0x1). RST: Yes, D-RST: No"
    info = judge(event(line))
    assert info.action is Action.RESET and info.severity >= Severity.FAIL


@pytest.mark.parametrize(
    ("code", "severity", "action"),
    [
        ("0x0 (None)", Severity.INFO, Action.RECORD),
        ("0x1 (GPU Reset Required)", Severity.FAIL, Action.RESET),
        ("0x2 (Node Reboot Required)", Severity.CRITICAL, Action.RESET),
        ("0x3 (Drain P2P)", Severity.FAIL, Action.DRAIN),
        ("0x4 (Drain and Reset)", Severity.FAIL, Action.RESET),
    ],
)
def test_154_follows_the_recovery_action(code: str, severity: Severity, action: Action) -> None:
    line = f"NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to {code}"
    info = judge(event(line))
    assert (info.severity, info.action) == (severity, action)


def test_45_names_the_xid_that_caused_it() -> None:
    line = "NVRM: Xid (PCI:0000:19:00): 45, pid=77, name=python, Ch 0b caused by previous Xid 149"
    ev = event(line)
    assert ev.caused_by == 149
    info = judge(ev)
    assert (info.severity, info.action) == (Severity.INFO, Action.RECORD)
    assert "Xid 149" in info.hint


def test_plain_lines_are_judged_by_the_table() -> None:
    ev = event(
        "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    )
    assert judge(ev) == classify(79)


# -- explain ------------------------------------------------------------------------------
def test_explain_a_known_xid() -> None:
    out = explain(94)
    assert out["known"] and out["mnemonic"] == "ROBUST_CHANNEL_CONTAINED_ERROR"
    assert out["immediate_action"] == "RESTART_APP" and out["action"] == "record"
    assert "RST" in out["driver_override"] and out["source"]


def test_explain_63_and_unknown() -> None:
    assert "pending" in explain(63)["severity"]
    out = explain(4242)
    assert (out["known"], out["name"], out["severity"]) == (False, "unknown Xid", "warn")


# -- slurmhealth xid N ---------------------------------------------------------------------
def test_cli_explains_one_xid() -> None:
    import json
    import os

    from tests.conftest import run_cli

    env = dict(os.environ)
    done = run_cli("xid", "109", "--json", env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["schema"] == "slurmhealth.xid/1"
    assert (out["xid"], out["mnemonic"], out["action"]) == (
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "reset",
    )
    table = run_cli("xid", "94", env=env)
    assert table.returncode == 0 and "RESTART_APP" in table.stdout
    bad = run_cli("xid", "abc", env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "slurmhealth: error: xid: 'abc' is not an Xid number (0-99999)"
    ]


def test_the_catalog_loads_only_when_an_xid_needs_it() -> None:
    import subprocess
    import sys

    code = (
        "import slurmhealth.checks.xid, slurmhealth.kernel_log, sys\n"
        "from slurmhealth.checks import xid_table\n"
        "assert xid_table._catalog.cache_info().currsize == 0\n"
        "assert 'slurmhealth.kernel_log.patterns' not in sys.modules\n"
        "xid_table.classify(79)\n"
        "assert xid_table._catalog.cache_info().currsize == 1\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
