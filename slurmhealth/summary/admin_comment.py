"""The compact job summary ``slurmhealth ctld-epilog`` stores in a job's ``AdminComment``
(slurmdbd), and how a login node reads it back.

Format ``sh1:<base32 of zlib of compact JSON>``, lower case and unpadded: ``sacctmgr modify
job ... set AdminComment=`` lowercases whatever it stores, so only a case-free encoding
survives (base32 decodes case-insensitively). Always at most :data:`MAX_CHARS` characters:
lists are capped and, when the whole still does not fit, cut further (messages first, then
rows), and ``cut`` says how many rows of each list were left out.

The JSON (short keys: it is stored once per job):
``v`` verdict, ``f`` fault class, ``c`` confidence, ``e`` efficiency headline, ``n`` node
count, ``dr`` drains ``[node, reason, ts]``, ``r`` the failing rows ``[label (f: finding,
e: event), node, gpu, check or kind, severity, ts, xid, evidence kind, level, message]``,
``cut`` ``{list: rows left out}``.

Pure: data in, text out, and back. Whatever is read back is checked field by field: an
AdminComment may have been written by anyone with operator rights.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "sh1:"
MAX_CHARS = 4000  # the stored text, prefix included: under 4 kB
MAX_ROWS = 24
MAX_DRAINS = 16
MAX_INFLATED = 64 * 1024  # a summary that inflates past this is not ours
BAD = ("warn", "fail", "critical")
_TEXT = {"v": 300, "e": 200}


def _cut(text: Any, cap: int) -> str:
    return "".join(ch for ch in str(text or "") if ch.isprintable())[:cap]


def _num(value: Any) -> float | None:
    return round(float(value), 1) if isinstance(value, int | float) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _row(label: str, node: str, row: Mapping[str, Any], msg_cap: int) -> list[Any]:
    raw = row.get("evidence")
    ev: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    name = row.get("check_name") if label == "f" else row.get("kind")
    gpu = row.get("gpu")
    return [label, node, _int(gpu), _cut(name, 40),
            _cut(row.get("severity"), 10), _num(row.get("ts")), _int(ev.get("xid")),
            _cut(ev.get("kind"), 30) or None, _cut(ev.get("level"), 20) or None,
            _cut(row.get("message"), msg_cap)]  # fmt: skip


def _rows(nodes: Sequence[Any], msg_cap: int) -> list[list[Any]]:
    """The findings and events at warn or worse, by severity then time."""
    out = []
    for nf in nodes:
        for label, rows in (("f", nf.findings), ("e", nf.events)):
            for row in rows:
                if isinstance(row, Mapping) and str(row.get("severity") or "").lower() in BAD:
                    out.append(_row(label, nf.node, row, msg_cap))
    rank = {"critical": 0, "fail": 1, "warn": 2}
    return sorted(out, key=lambda r: (rank.get(r[4].lower(), 3), r[5] or 0.0))


def _drains(nodes: Sequence[Any]) -> list[list[Any]]:
    seen: dict[str, list[Any]] = {}
    for nf in nodes:
        for d in nf.drains:
            if isinstance(d, Mapping) and str(d.get("state") or "").lower() in ("drained", "drain"):
                seen.setdefault(nf.node, [nf.node, _cut(d.get("reason"), 120), _num(d.get("ts"))])
    return list(seen.values())


def summary_of(report: Any, rows: int = MAX_ROWS, msg_cap: int = 80) -> dict[str, Any]:
    """The compact summary of a :class:`slurmhealth.report.build.Report`, lists capped."""
    ans, eff = report.answer, report.efficiency
    all_rows, drains = _rows(report.nodes, msg_cap), _drains(report.nodes)
    data: dict[str, Any] = {
        "v": _cut(report.verdict, _TEXT["v"]),
        "f": ans.fault_class if ans else "unknown",
        "c": ans.confidence if ans else None,
        "e": _cut(eff.lines[0], _TEXT["e"]) if eff and eff.lines else "",
        "n": len(report.nodes),
        "dr": drains[:MAX_DRAINS],
        "r": all_rows[:rows],
    }
    cut = {k: n for k, n in (("dr", len(drains) - MAX_DRAINS), ("r", len(all_rows) - rows))
           if n > 0}  # fmt: skip
    if cut:
        data["cut"] = cut
    return data


def encode(data: Mapping[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=True).encode()
    packed = base64.b32encode(zlib.compress(raw, 9)).decode().rstrip("=").lower()
    return PREFIX + packed


def fit(report: Any) -> str:
    """The report's summary, encoded, at most :data:`MAX_CHARS`: messages go first, then
    rows are halved until it fits (``cut`` counts what was left out)."""
    rows, msg_cap = MAX_ROWS, 80
    while True:
        text = encode(summary_of(report, rows, msg_cap))
        if len(text) <= MAX_CHARS:
            return text
        if msg_cap:
            msg_cap = 0
        elif rows:
            rows //= 2
        else:  # only the headline is left: drop the drains' reasons too
            data = summary_of(report, 0, 0)
            data["cut"] = {**data.get("cut", {}), "dr": len(data["dr"])}
            data["dr"] = []
            return encode(data)[:MAX_CHARS]


def decode(text: str) -> dict[str, Any] | None:
    """The summary in an AdminComment, checked; None when it holds none (or a broken one)."""
    text = (text or "").strip()
    if not text.lower().startswith(PREFIX) or len(text) > 2 * MAX_CHARS:
        return None
    body = text[len(PREFIX) :].upper()
    try:
        packed = base64.b32decode(body + "=" * (-len(body) % 8))
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, MAX_INFLATED)
        if inflater.unconsumed_tail:
            return None
        data = json.loads(raw)
    except (binascii.Error, ValueError, zlib.error):
        return None
    return _checked(data) if isinstance(data, dict) else None


def _checked(data: Mapping[str, Any]) -> dict[str, Any]:
    def lists(key: str, width: int, cap: int) -> list[list[Any]]:
        items = data.get(key)
        good = [x for x in items if isinstance(x, list) and len(x) == width] if isinstance(
            items, list) else []  # fmt: skip
        return good[:cap]

    conf, raw_cut = data.get("c"), data.get("cut")
    cut: Mapping[str, Any] = raw_cut if isinstance(raw_cut, dict) else {}
    return {
        "v": _cut(data.get("v"), _TEXT["v"]),
        "f": _cut(data.get("f"), 20) or "unknown",
        "c": float(conf) if isinstance(conf, int | float) and 0 <= conf <= 1 else None,
        "e": _cut(data.get("e"), _TEXT["e"]),
        "n": data.get("n") if isinstance(data.get("n"), int) else None,
        "dr": [[_cut(n, 64), _cut(r, 120), _num(t)] for n, r, t in lists("dr", 3, MAX_DRAINS)],
        "r": [_checked_row(r) for r in lists("r", 10, MAX_ROWS)],
        "cut": {k: v for k, v in cut.items() if k in ("dr", "r") and isinstance(v, int)},
    }


def _checked_row(r: list[Any]) -> list[Any]:
    label, node, gpu, name, sev, ts, xid, kind, level, msg = r
    return ["e" if label == "e" else "f", _cut(node, 64), _int(gpu), _cut(name, 40),
            _cut(sev, 10), _num(ts), _int(xid), _cut(kind, 30) or None,
            _cut(level, 20) or None, _cut(msg, 80)]  # fmt: skip


def node_rows(data: Mapping[str, Any], node: str) -> dict[str, tuple[dict[str, Any], ...]]:
    """The node's findings, events and drains as history-shaped rows (for diagnosis)."""
    findings, events = [], []
    for label, n, gpu, name, sev, ts, xid, kind, level, msg in data.get("r", ()):
        if n != node:
            continue
        ev = {k: v for k, v in (("xid", xid), ("kind", kind), ("level", level)) if v is not None}
        row = {"gpu": gpu, "severity": sev, "ts": ts, "message": msg, "evidence": ev}
        if label == "f":
            findings.append({**row, "check_name": name})
        else:
            events.append({**row, "kind": name})
    drains = [{"node": n, "state": "drained", "reason": r, "ts": t}
              for n, r, t in data.get("dr", ()) if n == node]  # fmt: skip
    return {"findings": tuple(findings), "events": tuple(events), "drains": tuple(drains)}
