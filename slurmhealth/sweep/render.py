"""A sweep's record (as ``run.run_sweep`` stores it) for people: text lines for the
terminal and one self-contained HTML page (the report's style, no scripts, no URLs) with a
pair-matrix heat map per test: each cell a pair's bandwidth as a share of the reference,
the diagonal each node alone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from slurmhealth.report.html import CSS

MATRIX_MAX_NODES = 64  # above: only the nodes in a slow or failed test get a row and column
UNIT_COLUMNS = ("test", "nodes", "value", "unit", "of reference", "status", "attempts", "jobs")
HEAT_CSS = """
.heat td{width:2.6em;text-align:center;font-size:11px;padding:1px 2px}
.heat th{font-size:11px;padding:1px 3px}.h-ok{background:#cfe8cf}.h-low{background:#f3e3a8}
.h-slow{background:#f2a8a0}.h-failed{background:#b00;color:#fff}.h-none{background:#f7f7f7}
.h-flaky{background:#f3e3a8}
"""


def _utc(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def headline(record: Mapping[str, Any]) -> str:
    """One line: which sweep, how big, how long."""
    s = record.get("settings", {})
    took = float(record.get("ended", 0)) - float(record.get("started", 0))
    return (f"sweep {record.get('id')}: {len(record.get('nodes', []))} nodes, "
            f"tests {'+'.join(s.get('tests', []))}, {record.get('jobs', 0)} jobs in "
            f"{record.get('rounds', 0)} rounds, {took:.0f} s, started "
            f"{_utc(record.get('started'))}")  # fmt: skip


def verdict_lines(record: Mapping[str, Any]) -> list[str]:
    """The verdict: each suspect with its confidence and evidence, or why there is none."""
    if record.get("inconclusive"):
        return [f"inconclusive: {record['inconclusive']} (nothing drained)"]
    suspects = record.get("suspects", [])
    if not suspects:
        blind = sum(1 for u in record.get("units", []) if u["status"] == "unjudged")
        if blind:
            return [f"no suspect, but {blind} test(s) not judged: no reference (a lone pair is "
                    "its own; pin one in [baseline.pinned], e.g. nccl.pair)"]  # fmt: skip
        return ["no suspect: every node and pair within the reference"]
    out = []
    for s in suspects:
        out.append(f"{s['kind'].upper()} {'-'.join(s['nodes'])} (confidence "
                   f"{float(s['confidence']):.0%}): {s['summary']}")  # fmt: skip
        for f in s.get("evidence", {}).get("history", [])[:5]:
            out.append(f"  history {f.get('node')}: {_utc(f.get('ts'))} {f.get('check_name')} "
                       f"{f.get('severity')} {f.get('message')}")  # fmt: skip
    for d in record.get("drains", []):
        out.append(
            f"drain {d['node']}: {d['state']}" + (f" ({d['detail']})" if d["detail"] else "")
        )
    for node, why in record.get("skipped", {}).items():
        out.append(f"skipped {node}: {why}")
    return out


def short(record: Mapping[str, Any]) -> str:
    """The verdict in a few words: ``suspect: NODE n2 (100%)``."""
    suspects = record.get("suspects", [])
    if record.get("inconclusive") or not suspects:
        return verdict_lines(record)[0]
    names = ", ".join(f"{s['kind'].upper()} {'-'.join(s['nodes'])} ({float(s['confidence']):.0%})"
                      for s in suspects)  # fmt: skip
    return f"{'suspect' if len(suspects) == 1 else 'suspects'}: {names}"


def unit_rows(record: Mapping[str, Any], only_bad: bool = False) -> list[tuple[Any, ...]]:
    """The pair table (:data:`UNIT_COLUMNS`), worst share first."""
    units = [u for u in record.get("units", []) if not only_bad or u["status"] != "ok"]
    units.sort(key=lambda u: (u["ratio"] if u["ratio"] is not None else -1.0, u["nodes"]))
    return [
        (u["test"], "-".join(u["nodes"]), _num(u["value"]), u["unit"],
         "-" if u["ratio"] is None else f"{u['ratio']:.0%}", u["status"],
         u["attempts"], ",".join(u["job_ids"]))
        for u in units
    ]  # fmt: skip


def _num(v: object) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


def _cell_class(u: Mapping[str, Any] | None, slow: float) -> str:
    if u is None or (u["ratio"] is None and u["status"] != "failed"):
        return "h-none"
    if u["status"] in ("slow", "failed", "flaky"):
        return f"h-{u['status']}"
    ratio = u["ratio"]
    return "h-low" if ratio is not None and ratio < (1 + slow) / 2 else "h-ok"


def _matrix(record: Mapping[str, Any], test: str) -> str:
    units = {tuple(u["nodes"]): u for u in record.get("units", []) if u["test"] == test}
    nodes = list(record.get("nodes", []))
    note = ""
    if len(nodes) > MATRIX_MAX_NODES:
        bad = {n for k, u in units.items() if u["status"] != "ok" for n in k}
        note = (f"<p>{len(nodes)} nodes: only the {len(bad)} in a test that was not ok are "
                "shown.</p>")  # fmt: skip
        nodes = [n for n in nodes if n in bad]
    slow = float(record.get("settings", {}).get("slow_fraction", 0.85))
    head = "".join(f"<th>{escape(n)}</th>" for n in nodes)
    rows = []
    for a in nodes:
        cells = []
        for b in nodes:
            u = units.get((a,) if a == b else tuple(sorted((a, b))))
            text = "" if u is None or u["ratio"] is None else f"{u['ratio']:.0%}"
            text = "fail" if u is not None and u["status"] == "failed" else text
            tip = "" if u is None else f' title="{escape(_tip(u))}"'
            cells.append(f'<td class="{_cell_class(u, slow)}"{tip}>{text}</td>')
        rows.append(f"<tr><th>{escape(a)}</th>{''.join(cells)}</tr>")
    return (f'{note}<table class="heat" id="matrix-{escape(test)}"><thead><tr><th></th>{head}'
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")  # fmt: skip


def _tip(u: Mapping[str, Any]) -> str:
    values = ", ".join(_num(v) for v in u["values"])
    jobs = ",".join(u["job_ids"])
    return f"{'-'.join(u['nodes'])}: {values} {u['unit']} ({u['status']}; jobs {jobs})"


def _table(cols: Sequence[str], rows: Sequence[Sequence[Any]], cls: str) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in r) + "</tr>" for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def to_html(record: Mapping[str, Any]) -> str:
    """The page: verdict first (``#verdict``), the heat maps (``#matrix-<test>``), the pair
    table (``#units``), the settings."""
    sev = "fail" if record.get("suspects") else "warn" if record.get("inconclusive") else "ok"
    sid = escape(str(record.get("id")))
    lines = "".join(f"<li>{escape(x)}</li>" for x in verdict_lines(record))
    tests = sorted({u["test"] for u in record.get("units", [])})
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>slurmhealth sweep {sid}</title><style>{CSS}{HEAT_CSS}</style></head><body>",
           f'<h1 id="sweep">slurmhealth sweep {sid}</h1>',
           f'<section class="answer edge-{sev}" id="answer"><p class="verdict sev-{sev}" '
           f'id="verdict">{escape(short(record))}</p>'
           f'<ul class="evidence-lines">{lines}</ul></section>',
           f'<p class="jobline">{escape(headline(record))}</p>']  # fmt: skip
    refs = record.get("references", {})
    for test in tests:
        ref = ", ".join(f"{k.split('.')[1]} {v:.1f}" for k, v in refs.items() if k.startswith(test))
        out.append(f'<h2 id="heat-{escape(test)}">{escape(test)}: share of the reference '
                   f"({escape(ref)})</h2>{_matrix(record, test)}")  # fmt: skip
    out.append('<h2 id="units">Tests, worst first</h2>')
    out.append(_table(UNIT_COLUMNS, unit_rows(record), "units"))
    settings = [(k, v) for k, v in record.get("settings", {}).items()]
    out.append('<h2 id="settings">Settings</h2>' + _table(("setting", "value"), settings, ""))
    out.append(f"<p><small>outputs in <code>{escape(str(record.get('output_dir')))}</code>; "
               "generated by slurmhealth</small></p></body></html>")  # fmt: skip
    return "\n".join(out) + "\n"
