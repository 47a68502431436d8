"""The Slurm adapter's readers of ``squeue -o``, ``sinfo -N -o`` and ``scontrol show job -o``
output: real-looking lines (Slurm 22.05 without accounting prints ``(null)`` for the account,
QOS and comment), a comment that tries to pass for another field, and 10,000 fuzzed lines of
each that give a record or nothing, never an exception."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from slurmhealth.slurm import parse_job_line, parse_nodes, parse_show_job

# `scontrol show job -o 57` on Slurm 22.05 (no accounting storage), one line
SHOW_JOB = (
    "JobId=57 JobName=train UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A "
    "Priority=4294901704 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "RunTime=00:00:12 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-01T03:00:00 "
    "EligibleTime=2026-12-01T03:00:00 AccrueTime=2026-12-01T03:00:00 "
    "StartTime=2026-12-01T03:00:01 EndTime=Unknown Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-12-01T03:00:01 Scheduler=Main Partition=gpu "
    "AllocNode:Sid=login1:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] "
    "BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=2,node=2,billing=2,gres/gpu=16 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
    "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/home/alice/train.sh WorkDir=/home/alice/my runs Comment={comment} "
    "StdErr=/home/alice/slurm-57.out StdIn=/dev/null StdOut=/home/alice/slurm-57.out "
    "Power= TresPerNode=gres:gpu:8"
)
SQUEUE = [
    "alice|(null)|gpu|(null)|4294901704|n[1-2]|RUNNING|(null)",  # 22.05, no accounting
    "bob|proj-7|gpu|normal|12345|n3|RUNNING|slurmhealth=off",
    "carol|proj|gpu|high|1000||PENDING|needs a|pipe",  # the comment keeps its "|"
]
SINFO = [
    "n1|idle|Unknown|Unknown|none",
    "n1|idle|Unknown|Unknown|none",  # again for its second partition
    "n2|drained|2026-11-30T08:01:02|root|slurmhealth: nvlink gpu3 link 7 inactive",
    "n3|down*|2026-11-30T08:01:02|slurm|Not responding",
    "n4|mixed|(null)|(null)|(null)",
]


def test_squeue_lines_with_nulls_are_unset_fields() -> None:
    a = parse_job_line("57", SQUEUE[0] + "\n")
    assert a is not None
    assert (a.user, a.account, a.qos, a.comment, a.partition) == ("alice", "", "", "", "gpu")
    assert (a.priority, a.nodes, a.state) == (4294901704, "n[1-2]", "running")
    b = parse_job_line("58", SQUEUE[1])
    assert b is not None and (b.account, b.qos, b.comment) == (
        "proj-7",
        "normal",
        "slurmhealth=off",
    )
    c = parse_job_line("59", SQUEUE[2])
    assert c is not None and (c.nodes, c.comment, c.state) == ("", "needs a|pipe", "pending")


@pytest.mark.parametrize("out", ["", "\n", "alice|proj", "a|b|c|d|e|f|g", "garbage"])
def test_squeue_output_of_another_shape_is_no_record(out: str) -> None:
    assert parse_job_line("57", out) is None


def test_squeue_priority_that_is_not_a_number_is_unknown() -> None:
    for prio in ("N/A", "٣", "-5", "9" * 400, ""):
        info = parse_job_line("1", f"u|a|p|q|{prio}|n1|RUNNING|")
        assert info is not None and info.priority is None


def test_sinfo_nodes_once_with_unset_reasons_empty() -> None:
    nodes = {n.name: n for n in parse_nodes("\n".join(SINFO))}
    assert list(nodes) == ["n1", "n2", "n3", "n4"]
    assert (nodes["n1"].reason, nodes["n1"].reason_user, nodes["n1"].reason_time) == ("", "", None)
    assert nodes["n2"].ours and nodes["n2"].drained and nodes["n2"].reason_user == "root"
    assert nodes["n2"].reason_time is not None
    assert nodes["n3"].state == "down*" and not nodes["n3"].ours
    assert (nodes["n4"].reason, nodes["n4"].reason_user) == ("", "")


def test_scontrol_show_job_fields_with_nulls_empty_and_spaces_kept() -> None:
    record = parse_show_job(SHOW_JOB.format(comment="nightly run") + "\n")
    assert record["Account"] == "" and record["QOS"] == "" and record["ReqNodeList"] == ""
    assert record["StdOut"] == "/home/alice/slurm-57.out"
    assert record["WorkDir"] == "/home/alice/my runs"
    assert record["Comment"] == "nightly run" and record["NodeList"] == "n[1-2]"
    assert record["TRES"] == "cpu=2,node=2,billing=2,gres/gpu=16"
    assert parse_show_job("") == {}


def test_a_comment_cannot_choose_another_field() -> None:
    """A job's comment that spells `` StdOut=/etc/shadow`` must not become the StdOut the
    epilog tails as root: a key seen twice is ambiguous and left out."""
    record = parse_show_job(SHOW_JOB.format(comment="x StdOut=/etc/shadow UserId=root(0)"))
    assert "StdOut" not in record and "UserId" not in record
    assert record["StdErr"] == "/home/alice/slurm-57.out" and record["JobId"] == "57"


# -- fuzzing ---------------------------------------------------------------------------------

ODD = ["(null)", "", " ", "|", "=", " X=", "N/A", "٣", "9" * 400, "é", "\x00", "\t", "(null",
       "-1", "None", "Unknown", "2026-13-45T99:99:99", "9999-12-31T23:59:59",
       "0000-01-01T00:00:00"]  # fmt: skip


def _mutate(line: str, rng: random.Random) -> str:
    """Characters replaced, dropped or inserted; sometimes cut short."""
    for _ in range(rng.choice([0, 1, 2, 4])):
        at = rng.randrange(len(line) + 1)
        cut = rng.choice([0, 1, rng.randint(1, 10)])
        line = (
            line[:at]
            + (rng.choice(ODD) if cut != 1 or rng.random() < 0.5 else "")
            + line[at + cut :]
        )
    return line[: rng.randrange(len(line) + 1)] if rng.random() < 0.1 else line


def _fields(rng: random.Random, line: str, sep: str) -> str:
    """Some fields of ``line`` replaced by odd values (the separator kept)."""
    parts = line.split(sep)
    for _ in range(rng.randint(0, 3)):
        parts[rng.randrange(len(parts))] = rng.choice(ODD)
    return sep.join(parts)


def _fuzz(
    rng: random.Random, bases: list[str], sep: str, parse: Callable[[str], Any], n: int = 10_000
) -> list[Any]:
    out = []
    for _ in range(n):
        lines = [
            _mutate(_fields(rng, rng.choice(bases), sep), rng) for _ in range(rng.randint(0, 3))
        ]
        out.append(parse("\n".join(lines)))
    return out


def test_squeue_fuzz_ten_thousand_outputs() -> None:
    results = _fuzz(random.Random(1), SQUEUE, "|", lambda out: parse_job_line("57", out))
    jobs = [j for j in results if j is not None]
    assert len(jobs) > 1000 and len(results) - len(jobs) > 1000
    for j in jobs:
        fields = (j.user, j.account, j.partition, j.qos, j.nodes, j.state, j.comment)
        assert "(null)" not in fields
        assert j.priority is None or 0 <= j.priority < 10**20


def test_scontrol_show_job_fuzz_ten_thousand_outputs() -> None:
    bases = [SHOW_JOB.format(comment=c) for c in ("(null)", "a b", "x StdOut=/y", "")]
    for record in _fuzz(random.Random(2), bases, " ", parse_show_job):
        assert all(isinstance(v, str) and v != "(null)" for v in record.values())
        assert all(k and "=" not in k for k in record)


def test_sinfo_fuzz_ten_thousand_outputs() -> None:
    for nodes in _fuzz(random.Random(3), SINFO, "|", parse_nodes):
        names = [n.name for n in nodes]
        assert len(names) == len(set(names)) and all(names)
        for n in nodes:
            assert "(null)" not in (n.name, n.reason, n.reason_user)
            assert n.reason_time is None or math.isfinite(n.reason_time)
