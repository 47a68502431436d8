"""A requeued job's facts across its nodes: the node whose prolog refused the launch ended
its attempt before the job started again elsewhere; the later attempt is the outcome."""

from __future__ import annotations

from slurmhealth.model_records import Job
from slurmhealth.report.sources import merge_job

REFUSED = Job("7", user="u", node_names=("n1",), start_ts=100.0, end_ts=101.0,
                   state="failed", exit_code="0:54")  # fmt: skip
RAN = Job("7", node_names=("n2",), start_ts=130.0, end_ts=400.0, state="completed",
               exit_code="0:0", time_limit_s=600.0)  # fmt: skip


def test_the_later_attempt_is_the_outcome_in_either_order() -> None:
    for merged in (merge_job(REFUSED, RAN), merge_job(RAN, REFUSED)):
        assert (merged.state, merged.exit_code, merged.node_names) == ("completed", "0:0", ("n2",))
        assert (merged.start_ts, merged.end_ts) == (100.0, 400.0)  # the story starts at n1
        assert merged.user == "u" and merged.time_limit_s == 600.0  # the rest is filled


def test_nodes_of_one_attempt_still_merge_worst_state() -> None:
    n1 = Job("8", node_names=("n1", "n2"), start_ts=100.0, end_ts=200.0, state="completed")
    n2 = Job("8", start_ts=100.5, end_ts=201.0, state="failed", exit_code="1:0")
    merged = merge_job(n1, n2)
    assert (merged.state, merged.exit_code, merged.end_ts) == ("failed", "1:0", 201.0)
