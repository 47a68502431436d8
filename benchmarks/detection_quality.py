"""Detection quality: false drains, missed faults and wrong GPUs on a corpus, and a soak.

Usage: python benchmarks/detection_quality.py [--only SUBSTR] [--soak-nodes 100]
       [--soak-days 10] [--jobs 1] [--no-soak] [--json] [--keep DIR]

The corpus (tests/support/corpus_faults.py, corpus_benign.py) holds every fault class the
check catalog detects on each GPU model it exists on (H100 SXM, A100 SXM4, V100 SXM2), mild
and severe, and benign scenarios healthy nodes produce, plus the network's
(tests/support/corpus_network.py): mlx5 kernel-log faults on a node with RDMA devices
through the same hooks, and NCCL logs (real ones from NVIDIA/nccl issues and lines filled
from NCCL's formats) through the diagnosis; their precision and recall are printed. Each
scenario runs as prolog -> epilog (an hour later) -> next prolog (5 s after the epilog) on a
simulated clock, through the real hooks (``run_hook`` with a recording Slurm backend, the
simulated NVML behind the real adapter, a history of its own). Detected means the expected
action: a drain (with the drain reason and every draining finding naming the faulty GPUs, or
no GPU for a node-level fault) or, for warn-level classes, a warning on the faulty GPU and
no drain. The soak runs healthy nodes with realistic noise for nodes x days simulated node-
days through the same path; every drain there is false.

Prints a confusion matrix per class and the soak figures; exits 1 if any false drain,
missed fault or wrong GPU (or any soak drain) was found.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.support.corpus_benign import benign_cases
from tests.support.corpus_faults import fault_cases
from tests.support.corpus_network import (
    NCCL_RULES,
    judge_nccl,
    nccl_cases,
    network_cases,
    precision_recall,
)
from tests.support.detection import Outcome, run_case
from tests.support.soak import SoakResult, soak

BAD = ("false_drain", "missed", "wrong_gpu")


def run_corpus(root: Path, epoch: float, only: str) -> list[Outcome]:
    net = network_cases(root / "rdma-tree")
    cases = [c for c in fault_cases() + benign_cases() + net if only in c.name]
    return [run_case(c, root / c.name.replace("/", "_"), epoch) for c in cases]


def network_quality(outcomes: list[Outcome], only: str) -> dict[str, dict[str, Any]]:
    """Precision and recall of the network's detections: the mlx5 kernel-log cases (a
    detected fault is a true positive, a missed one a false negative, a false drain a false
    positive) and each NCCL rule over the NCCL cases."""
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for o in outcomes:
        if o.case.klass.startswith("net_"):
            row = rows["mlx5 kernel log (hooks)"]
            row["cases"] += 1
            row["tp"] += o.verdict == "detected"
            row["fn"] += o.case.fault and o.verdict != "detected"
            row["fp"] += o.verdict == "false_drain"
    for case in (c for c in nccl_cases() if only in c.name):
        named = judge_nccl(case)
        for rule in NCCL_RULES:
            row = rows[f"nccl: {rule}"]
            row["cases"] += 1
            row["tp"] += rule in named and rule in case.expect
            row["fp"] += rule in named and rule not in case.expect
            row["fn"] += rule not in named and rule in case.expect
    out = {}
    for key, row in rows.items():
        precision, recall = precision_recall(row["tp"], row["fp"], row["fn"])
        out[key] = {**row, "precision": precision, "recall": recall}
    return out


def _print_network(table: dict[str, dict[str, Any]]) -> None:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    print(f"\n{'network':36} {'cases':>5} {'tp':>4} {'fp':>4} {'fn':>4} {'precision':>9} "
          f"{'recall':>6}")  # fmt: skip
    for key, r in table.items():
        print(f"{key:36} {r['cases']:5} {r['tp']:4} {r['fp']:4} {r['fn']:4} "
              f"{pct(r['precision']):>9} {pct(r['recall']):>6}")  # fmt: skip


def matrix(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    """Per class: cases, expected action, detected / passed, and the three error cells."""
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: Counter())
    for o in outcomes:
        key = o.case.klass if o.case.fault else f"benign: {o.case.klass}"
        row = rows[key]
        row["cases"] += 1
        row[o.verdict] += 1
        row.setdefault("expect", o.case.expect)
        presets = row.setdefault("presets", set())
        presets.add(o.case.preset.split("-")[0])
    out = {}
    for key, row in sorted(rows.items(), key=lambda kv: (kv[0].startswith("benign"), kv[0])):
        out[key] = {
            "expect": row["expect"],
            "models": sorted(row["presets"]),
            "cases": row["cases"],
            "ok": row["detected"] + row["ok"],
            **{cell: row[cell] for cell in BAD},
        }
    return out


def _print_matrix(table: dict[str, dict[str, Any]]) -> None:
    head = f"{'class':36} {'expect':6} {'models':14} {'cases':>5} {'ok':>4}"
    head += f" {'false drain':>11} {'missed':>6} {'wrong GPU':>9}"
    print(head)
    print("-" * len(head))
    totals: Counter[str] = Counter()
    for key, row in table.items():
        totals.update({k: row[k] for k in ("cases", "ok", *BAD)})
        print(
            f"{key:36} {row['expect']:6} {'/'.join(row['models']):14} {row['cases']:5} "
            f"{row['ok']:4} {row['false_drain']:11} {row['missed']:6} {row['wrong_gpu']:9}"
        )
    print("-" * len(head))
    print(
        f"{'total':36} {'':6} {'':14} {totals['cases']:5} {totals['ok']:4} "
        f"{totals['false_drain']:11} {totals['missed']:6} {totals['wrong_gpu']:9}"
    )


def _print_soak(r: SoakResult) -> None:
    d = r.to_dict()
    print(
        f"\nsoak: {d['nodes']} nodes x {r.days:g} days = {d['node_days']} node-days, "
        f"{d['runs_total']} runs ({', '.join(f'{k} {v}' for k, v in d['runs'].items())}), "
        f"{d['wall_s']} s wall"
    )
    print(f"  drains: {d['drains']}   failing checks by hand: {d['failing_checks_by_hand']}")
    warned = ", ".join(f"{k} {v}" for k, v in d["warnings_by_check"].items()) or "none"
    print(f"  warnings by check: {warned}")
    for drain in d["drain_details"]:
        print(f"  DRAIN {drain}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--soak-nodes", type=int, default=100)
    ap.add_argument("--soak-days", type=float, default=10.0)
    ap.add_argument("--no-soak", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="soak nodes run in parallel")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--keep", help="run in this directory and keep it (default: a temp dir)")
    args = ap.parse_args(argv)
    from slurmhealth.cli import once

    logging.basicConfig(format="slurmhealth: %(levelname)s: %(message)s")
    once.install_on_root()  # 200 cases rebuild 200 kernel-log positions: one line, counted
    with tempfile.TemporaryDirectory(prefix="slurmhealth-dq-") as tmp:
        root = Path(args.keep or tmp)
        epoch = float(int(time.time()))  # the simulated clock starts now (see tests/support)
        t0 = time.monotonic()
        outcomes = run_corpus(root / "corpus", epoch, args.only)
        corpus_s = time.monotonic() - t0
        table = matrix(outcomes)
        network = network_quality(outcomes, args.only)
        soaked = None if args.no_soak else soak(
            root / "soak", epoch, args.soak_nodes, args.soak_days, args.jobs
        )  # fmt: skip
    bad = [o for o in outcomes if o.verdict in BAD]
    nccl_wrong = sum(r["fp"] + r["fn"] for k, r in network.items() if k.startswith("nccl"))
    failed = bool(bad) or bool(soaked and soaked.drains) or bool(nccl_wrong)
    if args.json:
        doc = {
            "schema": "slurmhealth.detection-quality/1",
            "corpus": {
                "cases": len(outcomes),
                "faults": sum(o.case.fault for o in outcomes),
                "benign": sum(not o.case.fault for o in outcomes),
                "wall_s": round(corpus_s, 1),
                "matrix": table,
                "network": network,
                "errors": [o.to_dict() for o in bad],
                "outcomes": [
                    {k: v for k, v in o.to_dict().items() if k != "steps"} for o in outcomes
                ],
            },
            "soak": None if soaked is None else soaked.to_dict(),
            "passed": not failed,
        }
        print(json.dumps(doc, indent=1))
        return 1 if failed else 0
    faults = sum(o.case.fault for o in outcomes)
    print(f"corpus: {faults} fault and {len(outcomes) - faults} benign scenarios, "
          f"{corpus_s:.1f} s\n")  # fmt: skip
    _print_matrix(table)
    _print_network(network)
    for o in bad:
        print(f"  {o.verdict.upper()} {o.case.name}: {o.detail}")
    if soaked is not None:
        _print_soak(soaked)
    print("\nPASS" if not failed else "\nFAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
