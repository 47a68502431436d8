"""slurm/'s readers on output captured from real Slurm of both versions the project meets:
22.05.8 (Debian 12, the local cluster) and 24.11.5 (Debian 13, tests/package's trixie root,
where tests/package/test_trixie_slurm.py also runs them live). What differs is written next
to the lines."""

from __future__ import annotations

import pytest

from slurmhealth.slurm import parse_job_line, parse_listpids, parse_nodes, parse_show_job

# `sinfo -h -N -o '%N|%T|%H|%u|%E'`
SINFO = {
    "22.05": "n1|idle|Unknown|Unknown|none\nn2|idle|Unknown|Unknown|none\n",
    # 24.11 prints the user of the node's last state change without any reason
    "24.11": "n1|mixed|Unknown|Unknown|none\nn2|idle|Unknown|root|none\n"
    "n3|drained|2026-12-01T20:38:55|root|slurmhealth: test reason\n",
}
# `scontrol show job -o 1` on 24.11 with --comment='needs a|pipe' --extra=slurmhealth=off:
# Comment= and Extra= end in two blanks (Slurm prints "Comment=%s " and then the separator;
# 22.05's source does the same for Comment), Extra= is new, Command=(null) for --wrap
SHOW_JOB_24_11 = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-01T20:38:51 EligibleTime=2026-12-01T20:38:51 "
    "AccrueTime=2026-12-01T20:38:51 StartTime=2026-12-01T20:38:54 EndTime=Unknown "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T20:38:54 "
    "Scheduler=Main Partition=gpu AllocNode:Sid=localhost:0 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* ReqTRES=cpu=1,mem=1000M,node=1,billing=1 "
    "AllocTRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/ "
    "Comment=needs a|pipe  Extra=slurmhealth=off  StdErr=/tmp/j.out StdIn=/dev/null "
    "StdOut=/tmp/j.out TresPerNode=gres/gpu:8 \n"
)
# `squeue -h -j 1 -o SQUEUE_FORMAT` for that job (no accounting: account and QOS unset)
SQUEUE_24_11 = "root|(null)|gpu|(null)|1|n1|RUNNING|needs a|pipe\n"
# `scontrol listpids '*' NODE` on 24.11 (22.05 prints the same header and message)
LISTPIDS = (
    "PID      JOBID    STEPID   LOCALID GLOBALID\n"
    "213      1        batch    0       0        \n"
    "216      1        batch    -       -        \n"
)
UNKNOWN_NODE = (
    "scontrol: error: Domain socket directory /var/lib/slurm/slurmd/n9: No such file or "
    "directory\nNo job steps exist on this node.\n"
)


@pytest.mark.parametrize("version", sorted(SINFO))
def test_sinfo_idle_nodes_have_no_reason_nor_reason_user(version: str) -> None:
    nodes = {n.name: n for n in parse_nodes(SINFO[version])}
    for name in ("n1", "n2"):
        assert (nodes[name].reason, nodes[name].reason_user, nodes[name].reason_time) == (
            "",
            "",
            None,
        )
        assert not nodes[name].drained


def test_sinfo_24_11_drained_node_keeps_reason_user_and_time() -> None:
    n3 = parse_nodes(SINFO["24.11"])[2]
    assert (n3.state, n3.reason, n3.reason_user) == ("drained", "slurmhealth: test reason", "root")
    assert n3.drained and n3.reason_time is not None


def test_scontrol_show_job_24_11_with_comment_and_extra() -> None:
    job = parse_show_job(SHOW_JOB_24_11)
    assert job["Comment"] == "needs a|pipe" and job["Extra"] == "slurmhealth=off"
    assert (job["StdOut"], job["StdErr"], job["ExitCode"]) == ("/tmp/j.out", "/tmp/j.out", "0:0")
    assert job["Account"] == "" and job["Command"] == "" and job["NodeList"] == "n1"


def test_squeue_24_11_line() -> None:
    job = parse_job_line("1", SQUEUE_24_11)
    assert job is not None
    assert (job.user, job.account, job.qos, job.priority) == ("root", "", "", 1)
    assert (job.nodes, job.state, job.comment) == ("n1", "running", "needs a|pipe")


def test_listpids_steps_none_and_unknown_node() -> None:
    assert parse_listpids(0, LISTPIDS, "") == ["1"]
    assert parse_listpids(1, "", "No job steps exist on this node.\n") == []
    assert parse_listpids(1, "", UNKNOWN_NODE) is None
