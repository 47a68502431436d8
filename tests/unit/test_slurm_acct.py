"""Parsing what slurmdbd says about a job and its nodes (``sacct -P``, ``sacctmgr show
event -P``, with SLURM_TIME_FORMAT=%s), as Slurm 22.05 and 24.11 print it."""

from __future__ import annotations

from slurmhealth.slurm.acct import parse_events, parse_sacct

# verified on this machine's Slurm 22.05.8 (the same fields and order in 24.11)
SACCT = (
    "7|shuser|shacct|gpu|normal|n[1-3]|FAILED|3:0|1796156844|1796156853|60|"
    "billing=3,cpu=3,gres/gpu=24,node=3|sh1:abc\n"
)


def test_a_failed_three_node_job() -> None:
    job = parse_sacct("7", SACCT)
    assert job is not None
    assert (job.user, job.account, job.partition, job.qos) == ("shuser", "shacct", "gpu", "normal")
    assert job.node_names == ("n1", "n2", "n3")
    assert (job.state, job.exit_code) == ("failed", "3:0")
    assert (job.start_ts, job.end_ts, job.time_limit_s) == (1796156844.0, 1796156853.0, 3600.0)
    assert job.gpu_count == 24 and job.admin_comment == "sh1:abc"


def test_variants_unlimited_cancelled_running_requeued_and_typed_gres() -> None:
    out = (
        "8|bob|(null)|gpu|(null)|None assigned|PENDING|0:0|Unknown|Unknown|UNLIMITED|||\n"
        "8|bob|acct|gpu|normal|g[01-02]|CANCELLED by 0|0:15|1796156844|Unknown|"
        "Partition_Limit|cpu=2,gres/gpu:h100=16,node=2|note | with a bar\n"
    )
    job = parse_sacct("8", out)  # a requeued job: the last run wins
    assert job is not None
    assert job.node_names == ("g01", "g02") and job.state == "cancelled"
    assert job.end_ts is None and job.time_limit_s is None and job.gpu_count == 16
    assert job.admin_comment == "note | with a bar"


def test_other_jobs_lines_and_garbage_are_not_the_job() -> None:
    assert parse_sacct("9", SACCT) is None
    assert parse_sacct("7", "") is None
    assert parse_sacct("7", "7|only|three\n") is None
    bad = "7|u|a|p|q|n[1-|FAILED|x:y|soon|later|-5|gres/gpu=lots|\n"
    job = parse_sacct("7", bad)
    assert job is not None and job.node_names == () and job.exit_code is None
    assert job.start_ts is None and job.time_limit_s is None and job.gpu_count is None


def test_drain_events_of_the_jobs_nodes_oldest_first() -> None:
    out = (
        "n3|1796156900|Unknown|DRAIN|root(0)|slurmhealth: xid gpu5 Xid 79 | fallen off\n"
        "n2|1796156861|1796156862|DRAIN|root(0)|admin: maintenance\n"
        "|1796156000|Unknown|||cluster-wide event\n"
        "n9|1796156861|Unknown|DOWN|root(0)|not this job's\n"
        "broken line\n"
    )
    events = parse_events(out, ("n2", "n3"))
    assert [(e.node, e.state) for e in events] == [("n2", "drain"), ("n3", "drain")]
    assert events[1].end_ts is None
    assert events[1].reason == "slurmhealth: xid gpu5 Xid 79 | fallen off"
