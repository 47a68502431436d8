"""The Xid table against NVIDIA's current catalog: rows through 172, un-bucketed rows stay
warnings, and scripts/xid-catalog-diff compares the table with a site's CSV/XLSX download."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from slurmhealth.checks.xid_table import classify, explain, judge
from slurmhealth.kernel_log import parse_xid
from slurmhealth.model import Action, Severity
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "xid-catalog-diff"
# Xids 162-172 as the catalog names them (Mnemonic column)
NEW = {
    162: "PSHC_REENGAGED", 163: "PSHC_DISENGAGED", 164: "PSHC_LOW_LIFETIME",
    165: "PSHC_ZERO_LIFETIME", 166: "NVLINK_SECURE_CRYPTO_ERR", 167: "PCIE_FATAL_TIMEOUT",
    168: "REDUCED_GPU_MEMORY_CAPACITY", 169: "SEC2_HALT_ERROR", 170: "NVLINK_SECURE_OTHER",
    171: "UNCORRECTABLE_DRAM_ERROR", 172: "UNCORRECTABLE_SRAM_ERROR",
}  # fmt: skip
HEADER = [
    "Type (XID)", "Code", "Mnemonic", "Description", "Applies to A100", "Applies to H100",
    "Applies to B100", "Applies to GB200", "Resolution Bucket (Immediate Action)",
    "Resolution Bucket (Investigatory Action)",
]  # fmt: skip


@pytest.mark.parametrize("xid", sorted(NEW))
def test_cli_knows_every_xid_through_172(xid: int) -> None:
    done = run_cli("xid", str(xid), "--json", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["known"] is True and out["mnemonic"] == NEW[xid]
    # not bucketed by NVIDIA yet: a warning with its name and the reason, never a drain
    assert (out["severity"], out["action"], out["immediate_action"]) == (
        "warn",
        "record",
        "UNBUCKETED",
    )
    assert "resolution bucket" in out["reason"] and out["name"] != "unknown Xid"


def test_unbucketed_xid_in_a_kernel_line_never_drains() -> None:
    event = parse_xid("NVRM: Xid (PCI:0000:9b:00): 167, pid='<unknown>', name=<unknown>, x")
    assert event is not None
    info = judge(event)
    assert (info.severity, info.action, info.acts) == (Severity.WARN, Action.RECORD, False)
    assert "PCIe" in info.name


def test_108_and_160_follow_the_current_catalog() -> None:
    assert explain(108)["mnemonic"] == "NVLINK_REMOTE_TRANSLATION_ERROR"
    assert not classify(108).acts and classify(108).immediate == "IGNORE"
    assert not classify(160).acts and "earlier copies" in classify(160).source


def test_c2c_xid_121_is_recorded_not_drained() -> None:
    info = classify(121)
    assert info.mnemonic == "C2C_ERROR" and info.action is Action.RECORD
    assert info.severity is Severity.INFO


def _diff(path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(path), *flags],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _full_rows() -> list[list[str]]:
    """The packaged table written back as catalog rows (what an unchanged catalog holds)."""
    from slurmhealth.checks.xid_table import catalog_rows

    rows = []
    for xid, (mnemonic, bucket) in sorted(catalog_rows().items()):
        cell = "" if bucket == "UNBUCKETED" else bucket
        rows.append(["XID", str(xid), mnemonic, "d", "YES", "YES", "YES", "YES", cell, ""])
    return rows


def _csv(path: Path, rows: list[list[str]]) -> Path:
    import csv

    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([HEADER, *rows])
    return path


def test_diff_of_an_identical_csv_is_empty(tmp_path: Path) -> None:
    done = _diff(_csv(tmp_path / "xid.csv", _full_rows()))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 differences" in done.stdout


def test_diff_names_missing_changed_and_extra_rows(tmp_path: Path) -> None:
    rows = [r for r in _full_rows() if r[1] != "170"]  # the table has 170, this file not
    for r in rows:
        if r[1] == "79":
            r[8] = "RESET_GPU"  # NVIDIA moved 79's bucket
        if r[1] == "13":
            r[2] = "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"
    rows.append(["XID", "173", "NEW_THING", "d", "NO", "NO", "YES", "YES", "RESET_GPU", ""])
    done = _diff(_csv(tmp_path / "xid.csv", rows), "--json")
    assert done.returncode == 1, done.stderr
    found = {(d["xid"], d["kind"]) for d in json.loads(done.stdout)["differences"]}
    # 13's two-name mnemonic is the same row; nothing else differs
    assert found == {(79, "bucket"), (170, "extra"), (173, "missing")}


def _xlsx(path: Path, rows: list[list[str]]) -> Path:
    """A minimal XLSX (shared strings and inline strings, as spreadsheet tools write)."""
    strings: list[str] = []

    def cell(ref: str, text: str) -> str:
        if text.isdigit():
            return f'<c r="{ref}"><v>{text}</v></c>'
        strings.append(text)
        return f'<c r="{ref}" t="s"><v>{len(strings) - 1}</v></c>'

    body = "".join(
        f'<row r="{n + 1}">'
        + "".join(cell(f"{chr(65 + i)}{n + 1}", t) for i, t in enumerate(r) if t)
        + "</row>"
        for n, r in enumerate([HEADER, *rows])
    )
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    sst = "".join(f"<si><t>{s}</t></si>" for s in strings)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("xl/worksheets/sheet1.xml", "<worksheet/>")  # a cover sheet
        zf.writestr(
            "xl/worksheets/sheet2.xml", f"<worksheet {ns}><sheetData>{body}</sheetData></worksheet>"
        )
        zf.writestr("xl/sharedStrings.xml", f"<sst {ns}>{sst}</sst>")
    return path


def test_diff_reads_the_xlsx_download(tmp_path: Path) -> None:
    rows = _full_rows()
    rows = [r for r in rows if r[1] != "165"]
    done = _diff(_xlsx(tmp_path / "xid.xlsx", rows), "--json")
    assert done.returncode == 1, done.stderr
    assert [(d["xid"], d["kind"]) for d in json.loads(done.stdout)["differences"]] == [
        (165, "extra")
    ]


@pytest.mark.parametrize("content", [b"PK\x03\x04garbage", b"a,b\n1,2\n", b"\xff\xfe\x00"])
def test_diff_refuses_other_files_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.xlsx"
    path.write_bytes(content)
    done = _diff(path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
