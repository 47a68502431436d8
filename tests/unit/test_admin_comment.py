"""The job summary ``ctld-epilog`` stores in AdminComment: bounded, case-free, read back
defensively, and enough for a login node to say what the full report said."""

from __future__ import annotations

import base64
import json
import zlib
from types import SimpleNamespace
from typing import Any

from slurmhealth.diagnose.engine import diagnose, verdict
from slurmhealth.diagnose.facts import Facts, GpuStats, NodeFacts
from slurmhealth.model_records import Job
from slurmhealth.report.answer import answer
from slurmhealth.report.efficiency import efficiency
from slurmhealth.summary import admin_comment as ac

T0 = 1_800_000_000.0


def _xid79(node: str, gpu: int, ts: float) -> dict[str, Any]:
    return {"check_name": "xid", "severity": "critical", "gpu": gpu, "ts": ts,
            "message": f"Xid 79 on GPU {gpu}: GPU has fallen off the bus. " + "x" * 200,
            "evidence": {"xid": 79, "line": "NVRM: Xid (PCI:0000:53:00): 79"}}  # fmt: skip


def _report(n_nodes: int, bad_per_node: int) -> Any:
    nodes = []
    for i in range(n_nodes):
        name = f"gpu-node-{i:04d}"
        findings = tuple(_xid79(name, g, T0 + 60 + g) for g in range(bad_per_node))
        drains = ({"state": "drained", "ts": T0 + 70,
                   "reason": f"slurmhealth: xid gpu5 Xid 79 GPU has fallen off the bus {'y' * 80}"},
                  ) if bad_per_node else ()  # fmt: skip
        gpus = tuple(GpuStats(gpu=g, samples=10, util_mean=90.0) for g in range(8))
        nodes.append(NodeFacts(node=name, findings=findings, drains=drains, gpus=gpus))
    job = Job(job_id="42", user="alice", node_names=tuple(n.node for n in nodes),
                   start_ts=T0, end_ts=T0 + 600, state="failed", exit_code="1:0")  # fmt: skip
    facts = Facts(job=job, nodes=tuple(nodes))
    diags = diagnose(facts)
    text = verdict(diags, facts)
    return SimpleNamespace(verdict=text, answer=answer(text, diags, facts),
                           efficiency=efficiency(facts), nodes=facts.nodes)  # fmt: skip


def test_a_64_node_job_with_every_gpu_failing_stays_under_4_kB_and_says_what_was_cut() -> None:
    report = _report(64, 8)  # 512 critical findings, 64 drains
    text = ac.fit(report)
    assert len(text.encode()) < 4096, len(text)
    data = ac.decode(text)
    assert data is not None
    assert data["v"] == report.verdict[:300] and "Xid 79" in data["v"]
    assert data["f"] == "hardware" and data["n"] == 64
    assert len(data["r"]) <= ac.MAX_ROWS and len(data["dr"]) <= ac.MAX_DRAINS
    # what was left out is counted, not silently dropped
    assert data["cut"]["r"] == 512 - len(data["r"])
    assert data["cut"]["dr"] == 64 - len(data["dr"])


def test_the_summary_survives_sacctmgr_lowercasing_it() -> None:
    text = ac.fit(_report(3, 1))
    assert text == text.lower() and text.startswith("sh1:")
    assert all(ch.isalnum() or ch == ":" for ch in text)
    data = ac.decode(text.upper())  # any case reads back the same
    assert data == ac.decode(text)
    rows = ac.node_rows(data or {}, "gpu-node-0001")
    assert rows["findings"][0]["check_name"] == "xid"
    assert rows["findings"][0]["evidence"] == {"xid": 79}
    assert rows["findings"][0]["gpu"] == 0
    assert rows["drains"][0]["state"] == "drained"


def _packed(payload: bytes) -> str:
    return "sh1:" + base64.b32encode(zlib.compress(payload)).decode().rstrip("=").lower()


def test_hostile_or_foreign_admin_comments_read_as_no_summary() -> None:
    assert ac.decode("") is None
    assert ac.decode("reset gpu 5 on n2, ticket 4711") is None  # an admin's own note
    assert ac.decode("sh1:not base32!") is None
    assert ac.decode(_packed(b"[1, 2]")) is None
    assert ac.decode(_packed(b"{" + b" " * 200_000 + b"}")) is None  # a zip bomb
    assert ac.decode("sh1:" + "a" * 9000) is None
    # wrong shapes inside: each field checked, bad rows dropped, text bounded
    data = ac.decode(_packed(json.dumps({
        "v": "x" * 5000, "f": 7, "c": 9, "n": "64", "dr": [["n1"], ["n2", "r", "t"]],
        "r": [["f", "n1", "5", "xid", "fail", None, "79", None, None, "m"], "junk"],
        "cut": {"r": 3, "evil": 1},
    }).encode()))  # fmt: skip
    assert data is not None
    assert len(data["v"]) == 300 and data["f"] == "7" and data["c"] is None and data["n"] is None
    assert data["dr"] == [["n2", "r", None]]
    assert data["r"] == [["f", "n1", None, "xid", "fail", None, None, None, None, "m"]]
    assert data["cut"] == {"r": 3}


def test_incompressible_text_is_cut_to_fit_and_the_headline_survives() -> None:
    import random

    rng = random.Random(1)
    report = _report(64, 8)
    noisy = []
    for nf in report.nodes:
        rows = tuple(
            {**f, "message": "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=200))}
            for f in nf.findings
        )
        drains = tuple({**d, "reason": "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=120))}
                       for d in nf.drains)  # fmt: skip
        noisy.append(type(nf)(node=nf.node, findings=rows, drains=drains, gpus=nf.gpus))
    report.nodes = tuple(noisy)
    text = ac.fit(report)
    assert len(text) <= ac.MAX_CHARS
    data = ac.decode(text)
    assert data is not None and "Xid 79" in data["v"] and data["f"] == "hardware"
    assert data["cut"]["r"] + len(data["r"]) == 512
    assert all(row[-1] == "" for row in data["r"])  # messages went first
