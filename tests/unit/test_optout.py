"""The per-job opt-out (``policy.optout_token``, default ``slurmhealth=off``, in the job's
``--comment`` or ``--extra``) counts only as a whole word: words split at blanks, commas and
semicolons. ``slurmhealth=office`` is not the token; ``foo slurmhealth=off,bar`` holds it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.hooks.job import complete, job_from_env
from slurmhealth.model_records import Job, job_label_values
from slurmhealth.slurm import parse_job_line
from tests.support.recording_slurm import RecordingSlurm

TOKEN = "slurmhealth=off"


@pytest.mark.parametrize(
    "text",
    [
        "slurmhealth=off",
        "foo slurmhealth=off",
        "slurmhealth=off,bar",
        "a;slurmhealth=off;b",
        "  slurmhealth=off\t",
        "nightly,\nslurmhealth=off",
    ],
)
def test_the_token_as_a_word_opts_out(text: str) -> None:
    assert Job("1", "n1", comment=text).opted_out(TOKEN)
    assert Job("1", "n1", extra=text).opted_out(TOKEN)


@pytest.mark.parametrize(
    "text",
    [
        "xslurmhealth=offy",
        "slurmhealth=office",
        "noslurmhealth=off",
        "slurmhealth=off2",
        "slurmhealth=of",
        "SLURMHEALTH=OFF",
        "slurmhealth = off",
        "",
        "(null)",
    ],
)
def test_the_token_inside_another_word_does_not(text: str) -> None:
    assert not Job("1", "n1", comment=text, extra=text).opted_out(TOKEN)


def test_no_token_configured_never_opts_out() -> None:
    assert not Job("1", "n1", comment="slurmhealth=off").opted_out("")
    assert not Job("1", "n1", comment="slurmhealth=off").opted_out(" , ")


def test_a_token_of_several_words_must_appear_in_order() -> None:
    job = Job("1", "n1", comment="run skip health-checks now")
    assert job.opted_out("skip health-checks") and not job.opted_out("health-checks skip")


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    words=st.lists(st.text("abcehlmostuf=x", min_size=1, max_size=18), max_size=6),
    seps=st.lists(st.sampled_from([" ", ",", ";", ", ", "\t", " ; "]), min_size=7, max_size=7),
    at=st.integers(0, 6),
)
def test_words_around_the_token(words: list[str], seps: list[str], at: int) -> None:
    """Without the token among the words: no opt-out, whatever it is glued to; with it
    inserted as a word: opt-out."""
    text = "".join(w + s for w, s in zip(words, seps, strict=False))
    assert Job("1", "n1", comment=text).opted_out(TOKEN) == (TOKEN in words)
    words.insert(min(at, len(words)), TOKEN)
    text = "".join(w + s for w, s in zip(words, seps, strict=False))
    assert Job("1", "n1", comment=text).opted_out(TOKEN)


def test_from_slurms_environment_and_from_squeue() -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_ACCOUNT": "p", "SLURM_JOB_EXTRA": "a,slurmhealth=off"}
    assert job_from_env(env, "n1").opted_out(TOKEN)
    env["SLURM_JOB_EXTRA"] = "slurmhealth=office"
    assert not job_from_env(env, "n1").opted_out(TOKEN)
    # Slurm 22.05 passes neither: one squeue call fills the comment ("(null)" when unset)
    slurm = RecordingSlurm([])
    bare = job_from_env({"SLURM_JOB_ID": "9"}, "n1")
    for comment, out in (
        ("(null)", False),
        ("slurmhealth=offline", False),
        ("x slurmhealth=off", True),
    ):
        info = parse_job_line("9", f"alice|(null)|gpu|(null)|100|n1|RUNNING|{comment}")
        assert info is not None
        slurm.jobs["9"] = info
        job = complete(bare, slurm, {"SLURM_JOB_ID": "9"})
        assert job.opted_out(TOKEN) is out, comment
        assert (job.account, job.qos) == ("", "")


def test_a_token_given_with_commas_or_semicolons_is_split_alike() -> None:
    job = Job("1", "n1", extra="skip health;checks")
    assert job.opted_out("skip,health;checks") and job.opted_out("health;checks")
    assert not job.opted_out("health,skip")


@pytest.mark.parametrize(
    ("exit_code", "failed"),
    [
        (None, False),
        ("", False),
        ("0:0", False),
        ("0", False),
        ("1:0", True),
        ("0:9", True),
        ("3", True),
    ],
)
def test_the_epilog_counts_a_job_failed_by_its_exit_code_or_signal(
    exit_code: str | None, failed: bool
) -> None:
    """What the epilog records as the job's end (``failed`` or ``completed``)."""
    assert Job("1", "n1", exit_code=exit_code).failed is failed


def test_the_series_labels_of_a_job() -> None:
    """job_id, user, priority and node as the exporter labels every series of the job."""
    job = Job("42", "", user="alice", priority=1000)
    assert job_label_values(job, "gpu-b07") == ("42", "alice", "1000", "gpu-b07")
    assert job_label_values(Job("42", "n3", priority=0), "gpu-b07") == ("42", "", "0", "n3")
    assert job_label_values(Job("42", "n3"), "x") == ("42", "", "", "n3")
