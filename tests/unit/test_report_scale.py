"""The report at fleet scale: with many ``{node}`` histories on a shared path it reads
only the job's nodes' (and while the node list is unknown, one history at a time), so a low
open-file limit never stops it; past incidents are the job's GPUs' from before its end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmhealth.history import Batch, History

REPO = Path(__file__).resolve().parents[2]
NODES = 60
T0, END = 1_700_000_000.0, 1_700_003_600.0
JOB_NODES = ("n50", "n51", "n52")

PROBE = """
import json, resource, sys
from slurmhealth.config import load_config
from slurmhealth.history import reader
from slurmhealth.report.gather import build_report

live, opened, peak = set(), [], [0]
connect, close = reader.Reader.connection, reader.Reader.close

def connection(self):
    if self._conn is None:
        live.add(id(self)); opened.append(self.path); peak[0] = max(peak[0], len(live))
    return connect(self)

def closing(self):
    live.discard(id(self)); close(self)

reader.Reader.connection, reader.Reader.close = connection, closing
cfg = load_config(sys.argv[1], env={})
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
r = build_report(cfg, "42")
print(json.dumps({"peak": peak[0], "opened": sorted(set(opened)), "nodes": list(r.job.node_names),
                  "incidents": [[i.job_id, i.node, i.gpu] for i in r.past_incidents]}))
"""


def _event(ts: float, node: str, job: str, gpu: int) -> tuple[str, dict[str, object]]:
    return ("events", {"ts": ts, "node": node, "job_id": job, "gpu": gpu, "kind": "xid",
                       "severity": "critical", "message": "Xid 79",
                       "evidence": {"xid": 79}})  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fleet")
    for i in range(1, NODES + 1):
        node = f"n{i}"
        inserts = [] if node in JOB_NODES else [_event(T0 - 7200, node, "19", 1)]  # elsewhere
        upserts = []
        if node in JOB_NODES:
            job = {"job_id": "42", "node": node, "uid": 0, "user": "root", "nodes": "n[50-52]",
                   "gpus": [0, 1], "start_ts": T0, "end_ts": END, "state": "failed"}  # fmt: skip
            upserts.append(("jobs", job, "job_id"))
            inserts += [("samples", {"ts": T0 + 10 * k, "node": node, "job_id": "42",
                                     "gpu": g, "util_pct": 90.0})
                        for k in range(30) for g in (0, 1)]  # fmt: skip
        if node == "n51":
            inserts += [_event(T0 + 60, node, "42", 1),  # the job's own fault
                        _event(T0 - 3600, node, "17", 1),  # before it, same GPU: listed
                        _event(END + 3600, node, "99", 1),  # after its end: never
                        _event(T0 - 3600, node, "18", 7)]  # another GPU: never  # fmt: skip
        with History(tmp / "db" / f"{node}.db") as h:
            assert h.write(Batch(inserts=inserts, upserts=upserts))
    return tmp


@pytest.mark.parametrize("here", ["n50", "login"])  # a job node, or a node without a history
def test_report_reads_only_the_jobs_nodes_one_history_at_a_time(fleet: Path, here: str) -> None:
    cfg = fleet / f"{here}.toml"
    cfg.write_text(f'[node]\nname = "{here}"\n[paths]\ndb = "{fleet}/db/{{node}}.db"\n'
                   f'evidence_dir = "{fleet}/evidence"\n')  # fmt: skip
    # 60 histories in WAL mode need ~180 descriptors if all were kept open
    proc = subprocess.run([sys.executable, "-c", PROBE, str(cfg), "48"], capture_output=True,
                          text=True, cwd=REPO, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["peak"] <= 2 and got["nodes"] == list(JOB_NODES)
    read_for_facts = {Path(p).stem for p in got["opened"]}
    if here == "n50":
        assert read_for_facts == set(JOB_NODES)
    else:  # looked for the node list until the first history that knows it, n50
        assert set(JOB_NODES) <= read_for_facts and len(read_for_facts) < NODES
    assert got["incidents"] == [["17", "n51", 1]]
