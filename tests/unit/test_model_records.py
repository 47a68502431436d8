"""The job records' own decisions (slurmhealth.model_records): whether the job failed (the
epilog's ``jobs`` row state and its evidence bundle), the label values of its series, and the
opt-out token at the edges of the comment (tests/unit/test_optout.py has the word rules)."""

from __future__ import annotations

import pytest

from slurmhealth.model_records import GPU_LABELS, JOB_LABELS, Job, job_label_values


@pytest.mark.parametrize("code", [None, "", "0:0", "0"])
def test_a_job_that_exited_0_without_a_signal_did_not_fail(code: str | None) -> None:
    assert Job("7", "n1", exit_code=code).failed is False


@pytest.mark.parametrize("code", ["1:0", "0:9", "137", "0:15", "1"])
def test_a_non_zero_exit_or_a_signal_is_a_failed_job(code: str) -> None:
    assert Job("7", "n1", exit_code=code).failed is True


def test_the_series_labels_are_the_jobs_with_this_node_when_it_names_none() -> None:
    assert JOB_LABELS == ("job_id", "user", "priority", "node")
    assert GPU_LABELS == ("job_id", "user", "priority", "node", "gpu", "uuid")
    job = Job("42", "", user="alice", priority=1000)
    assert job_label_values(job, "gpu-a01") == ("42", "alice", "1000", "gpu-a01")
    assert job_label_values(Job("42", "gpu-b07", priority=0), "gpu-a01") == (
        "42", "", "0", "gpu-b07"
    )  # fmt: skip  # priority 0 is a priority, not "unknown"
    assert job_label_values(Job("42", ""), "gpu-a01")[2] == ""  # no priority known


@pytest.mark.parametrize(
    ("token", "comment", "extra"),
    [
        ("skip,health", "run skip health", ""),  # the token's own commas split it too
        ("skip;health", "", "skip,health"),
        ("skip health", "nightly", "a b skip health"),  # the last words of the second text
        ("off", "off", ""),  # the whole text, one word
    ],
)
def test_the_token_at_the_edges_of_either_text_opts_out(
    token: str, comment: str, extra: str
) -> None:
    assert Job("1", "n1", comment=comment, extra=extra).opted_out(token)


@pytest.mark.parametrize(
    ("token", "comment"),
    [
        ("skip health", "skip"),  # the first word alone, at the end
        ("skip health", "health skip"),
        ("a b c", "a b"),
        ("", ""),
    ],
)
def test_a_token_only_partly_there_does_not_opt_out(token: str, comment: str) -> None:
    assert not Job("1", "n1", comment=comment, extra=comment).opted_out(token)
