"""NVLink5 Xids 144-150 judged by their decoded status fields (the catalog's "XID 144-150
Decode" tab), in both intrInfo encodings (V1 before driver R575, V2 from R575 on)."""

from __future__ import annotations

import pytest

from slurmhealth.checks.xid_nvlink5 import decode
from slurmhealth.checks.xid_table import judge
from slurmhealth.kernel_log import parse_xid
from slurmhealth.model import Action, Severity, XidEvent

# Lines in the documented format (WORKFLOW_NVLINK5_ERR), as GB200 nodes log them
NETIR = (
    "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 "
    "(0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
LINK_DOWN_PEER = (
    "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
    "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
RXPIPE = (
    "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
    "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)


def event(line: str) -> XidEvent:
    parsed = parse_xid(line)
    assert parsed is not None, line
    return parsed


def test_v1_link_down_with_peer_reason_is_fatal() -> None:
    d = decode(149, LINK_DOWN_PEER)
    assert d is not None and (d.version, d.sub, d.reason, d.bucket) == (
        "V1",
        "NETIR_LINK_EVT",
        0x25,
        "RESET_GPU",
    )
    info = judge(event(LINK_DOWN_PEER))
    assert (info.severity, info.action, info.basis) == (Severity.FAIL, Action.RESET, "decode")
    assert info.acts and "link 0" in info.hint


def test_v1_rxpipe_status_8_is_ignored() -> None:
    info = judge(event(RXPIPE))
    assert (info.severity, info.action, info.acts) == (Severity.INFO, Action.RECORD, False)
    assert "0x00000008" in info.hint


def test_v1_rxpipe_with_the_action2_bit_resets() -> None:
    # intrInfo bit 10 set (V1 "Decode for action 2"), status 0x1: RESET_GPU
    line = RXPIPE.replace("0x0409a0c2 0x00000008", "0x0409a4c2 0x00000001")
    assert decode(145, line).bucket == "RESET_GPU"  # type: ignore[union-attr]
    assert judge(event(line)).acts


def test_netir_interrupt_is_link_fatal() -> None:
    assert judge(event(NETIR)).action is Action.RESET


@pytest.mark.parametrize(
    ("xid", "sub", "intr", "status", "bucket"),
    [
        (144, "SAW_MVB", 0x00000001, 0x2, "RESET_GPU"),
        (144, "SAW_MVB", 0x00000001, 0x4, "IGNORE"),
        (145, "RLW_REMAP", 0x00000004, 0x1, "XID_154_EVAL"),
        (145, "RLW_TAGSTATE", 0x00000008, 0x00020000, "RESET_GPU"),
        (146, "TLW_RX_PIPE1", 0x0000000B, 0x4, "RESET_GPU"),
        (146, "TLW_TX_PIPE0", 0x0000000C, 0x2, "IGNORE"),
        (147, "TREX", 0x0000000E, 0x1, "IGNORE"),
        (149, "NETIR_LINK_DOWN", 0x00000011, 0x0, "RESET_GPU"),
        (149, "NETIR_BER_EVENT", 0x00000013, 0x2, "IGNORE"),
        (149, "NETIR_MFDE_EVENT", 0x00000014, 0x3, "IGNORE"),
        (149, "NETIR_MFDE_EVENT", 0x00000014, 0x5, "RESET_GPU"),
        (150, "MSE", 0x00000000, 0x0, "RESET_GPU"),
    ],
)
def test_v2_rows_of_the_decode_table(
    xid: int, sub: str, intr: int, status: int, bucket: str
) -> None:
    """R575 and later: the sub component in intrInfo[6:0] (the name confirms V2)."""
    line = (
        f"NVRM: Xid (PCI:0008:01:00): {xid}, {sub} Nonfatal XC0 i0 Link 3 "
        f"(0x{intr:08x} 0x{status:08x} 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    d = decode(xid, line, driver="575.57.08")
    assert d is not None and d.bucket == bucket, d
    assert judge(event(line), driver="575.57.08").acts == (bucket == "RESET_GPU")


def test_encoding_follows_the_driver_when_the_name_does_not_tell() -> None:
    # intrInfo 0x22: V1 [9:5] = 1 (SAW_MVB), V2 [6:0] = 0x22 (no row): the name says V1
    line = "NVRM: Xid (PCI:0008:01:00): 144, SAW_MVB Fatal XC0 i0 Link 1 (0x00000021 0x00000002)"
    assert decode(144, line, driver="580.65.06").version == "V1"  # type: ignore[union-attr]
    # a name neither encoding confirms: the driver decides
    odd = line.replace("SAW_MVB", "SAW")
    assert decode(144, odd, driver="580.65.06").version == "V2"  # type: ignore[union-attr]
    assert decode(144, odd, driver="570.124.06").version == "V1"  # type: ignore[union-attr]


def test_unknown_status_follows_the_line_word() -> None:
    fatal = RXPIPE.replace("0x00000008", "0x00004000").replace("Nonfatal", "Fatal")
    assert judge(event(fatal)).acts
    nonfatal = RXPIPE.replace("0x00000008", "0x00004000")
    info = judge(event(nonfatal))
    assert (info.severity, info.acts) == (Severity.WARN, False) and "decode table" in info.hint


def test_a_line_without_the_fields_keeps_the_catalog_row() -> None:
    info = judge(event("NVRM: Xid (PCI:0008:01:00): 149, pid=1, name=x, NVLink error"))
    assert info.basis == "catalog" and info.acts  # WORKFLOW_NVLINK5_ERR drains


def test_xid_explains_the_nvlink5_decode() -> None:
    from slurmhealth.checks.xid_table import explain

    out = explain(149)
    assert out["mnemonic"] == "NVLINK_NETIR_ERROR" and "R575" in out["decode"]
    assert "decode" not in explain(79)
