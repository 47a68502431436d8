"""Every outcome of a drain decision, in full (state, the reason Slurm gets, the detail the
history records), over the recording Slurm backend: the policy, a node someone else holds,
the circuit breaker and its rounding, a race of two prologs, and each Slurm failure."""

from __future__ import annotations

import os

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.hooks.drain import DrainOutcome, drain_candidates, drain_node, drain_reason
from slurmhealth.model import Action, Finding, Severity
from slurmhealth.slurm import NodeInfo
from tests.support.recording_slurm import CTLD_DOWN, RecordingSlurm

NVLINK = Finding("nvlink", Severity.FAIL, "NVLink 7 inactive", Action.DRAIN, gpu=3)
REASON = "slurmhealth: nvlink gpu3 NVLink 7 inactive"


def cfg(mode: str = "drain", share: float = 0.5) -> Config:
    flags = {"policy.mode": mode, "policy.drain_max_share": share}
    return load_config(os.devnull, env={}, flags=flags)


def idle(*names: str) -> list[NodeInfo]:
    return [NodeInfo(n, "idle") for n in names]


def ours(name: str, at: float | None = 1.0) -> NodeInfo:
    return NodeInfo(name, "drained", f"slurmhealth: xid gpu0 {name}", "root", at)


# -- the reason and the candidates --------------------------------------------------------------
def test_the_reason_names_the_worst_finding_its_gpu_the_xids_and_the_rest() -> None:
    assert drain_reason([NVLINK]) == REASON
    node_level = Finding("gpu_count", Severity.FAIL, "7 of 8 GPUs", Action.DRAIN)
    assert drain_reason([node_level]) == "slurmhealth: gpu_count 7 of 8 GPUs"
    xid79 = Finding("xid", Severity.CRITICAL, "Xid 79", Action.RESET, gpu=0,
                    evidence={"xid": 79})  # fmt: skip
    xid94 = Finding("xid", Severity.FAIL, "Xid 94", Action.RESET, gpu=1, evidence={"xid": 94})
    assert drain_reason([xid79]) == "slurmhealth: xid gpu0 Xid 79"  # no tag on itself
    assert drain_reason([xid94, xid79, NVLINK]) == "slurmhealth: xid gpu0 Xid 79 (+2 more)"
    lost = Finding("gpu_lost", Severity.CRITICAL, "GPU lost", Action.RESET, gpu=0)
    assert drain_reason([xid94, lost, xid79]) == (
        "slurmhealth: gpu_lost gpu0 GPU lost [Xid 79,94] (+2 more)"  # worst: then by name
    )


def test_only_failing_findings_that_take_the_node_out_are_candidates() -> None:
    warn_drain = Finding("pcie", Severity.WARN, "x16 -> x8", Action.DRAIN, gpu=0)
    fail_record = Finding("xid", Severity.FAIL, "Xid 13", Action.RECORD, gpu=0)
    assert drain_candidates([warn_drain, fail_record, NVLINK]) == [NVLINK]


# -- outcomes -----------------------------------------------------------------------------------
def test_policy_warn_records_and_never_calls_slurm() -> None:
    slurm = RecordingSlurm(idle("n1"), fail=["nodes", "drain"])
    got = drain_node(cfg("warn"), slurm, "n1", [NVLINK])
    assert got == DrainOutcome("policy_warn", REASON, "policy.mode = warn: recorded, not drained")
    assert slurm.drains == [] and not got.keeps_job_off


def test_a_node_list_slurm_cannot_give_is_a_failed_drain_that_keeps_the_job_off() -> None:
    got = drain_node(cfg(), RecordingSlurm(idle("n1"), fail=["nodes"]), "n1", [NVLINK])
    assert got == DrainOutcome("failed", REASON, f"cannot read node states: nodes: {CTLD_DOWN}")
    assert got.keeps_job_off


def test_a_node_slurmhealth_drained_keeps_its_first_reason() -> None:
    slurm = RecordingSlurm([ours("n1"), *idle("n2")])
    got = drain_node(cfg(), slurm, "n1", [NVLINK])
    assert got == DrainOutcome(
        "already", "slurmhealth: xid gpu0 n1", "already drained by slurmhealth"
    )
    assert slurm.drains == [] and got.keeps_job_off


@pytest.mark.parametrize(("user", "by"), [("alice", " by alice"), ("", "")])
def test_a_reason_someone_else_set_is_left_as_is(user: str, by: str) -> None:
    slurm = RecordingSlurm([NodeInfo("n1", "drained", "riser swap", user, 5.0), *idle("n2")])
    got = drain_node(cfg(), slurm, "n1", [NVLINK])
    assert got == DrainOutcome("held", REASON, f"already drained{by}: 'riser swap'; left as is")
    assert slurm.drains == [] and got.keeps_job_off


def test_the_circuit_breaker_counts_only_nodes_slurmhealth_drained() -> None:
    nodes = [
        ours("n1"),
        NodeInfo("n2", "drained", "admin"),
        NodeInfo("n3", "idle", "slurmhealth: old"),
    ]
    nodes += idle(*(f"n{i}" for i in range(4, 11)))  # 10 nodes, share 0.1: limit 1
    slurm = RecordingSlurm(nodes)
    got = drain_node(cfg(share=0.1), slurm, "n5", [NVLINK])
    assert got == DrainOutcome(
        "suppressed",
        REASON,
        "circuit breaker: 1 of 10 nodes already drained by slurmhealth (limit 1: n1)",
    )
    assert slurm.drains == [] and not got.keeps_job_off
    slurm.table["n1"] = NodeInfo("n1", "idle")  # n2 (an admin's) and n3 (idle) do not count
    assert drain_node(cfg(share=0.1), slurm, "n5", [NVLINK]) == DrainOutcome("drained", REASON)
    two = RecordingSlurm([ours("n1", 2.0), ours("n2", 1.0), *idle("n3", "n4", "n5")])
    assert drain_node(cfg(share=0.4), two, "n3", [NVLINK]).detail == (
        "circuit breaker: 2 of 5 nodes already drained by slurmhealth (limit 2: n2, n1)"
    )


def test_a_node_missing_from_slurms_list_is_drained_all_the_same() -> None:
    slurm = RecordingSlurm(idle("n1", "n2"))  # e.g. the node list of another cluster view
    assert drain_node(cfg(), slurm, "n9", [NVLINK]) == DrainOutcome("drained", REASON)
    assert slurm.drains == [("n9", REASON)]


def test_the_limit_is_the_share_of_nodes_rounded_down_and_never_zero() -> None:
    # 100 x 0.29 is 28.999999999999996 in floating point: the limit is 29, not 28
    nodes = [ours(f"a{i:02}", float(i)) for i in range(28)] + idle(*(f"b{i:02}" for i in range(72)))
    got = drain_node(cfg(share=0.29), RecordingSlurm(nodes), "b00", [NVLINK])
    assert got.state == "drained"
    one = drain_node(cfg(share=0.01), RecordingSlurm(idle("n1", "n2")), "n1", [NVLINK])
    assert one.state == "drained"  # 2 x 0.01 rounds to 0: at least one node may drain


def test_a_drain_slurm_refuses_is_failed_and_keeps_the_job_off() -> None:
    got = drain_node(cfg(), RecordingSlurm(idle("n1", "n2"), fail=["drain"]), "n1", [NVLINK])
    assert got == DrainOutcome("failed", REASON, f"scontrol drain failed: drain: {CTLD_DOWN}")


class RaceSlurm(RecordingSlurm):
    """Another node's prolog drains ``rival`` (earlier) while ours drains."""

    def __init__(self, nodes: list[NodeInfo], rival: str, fail: tuple[str, ...] = ()) -> None:
        super().__init__(nodes, fail=fail)
        self.rival = rival

    def drain(self, node: str, reason: str) -> None:
        super().drain(node, reason)
        self.table[self.rival] = ours(self.rival, at=0.5)


def test_of_two_racing_drains_over_the_limit_the_later_undoes_itself() -> None:
    slurm = RaceSlurm(idle("n1", "n2", "n3", "n4"), rival="n2")
    got = drain_node(cfg(share=0.25), slurm, "n1", [NVLINK])
    assert got == DrainOutcome(
        "suppressed", REASON, "circuit breaker: n2 drained first (limit 1); undone"
    )
    assert slurm.drains == [("n1", REASON)] and slurm.resumes == ["n1"]
    assert slurm.table["n1"].state == "idle" and not got.keeps_job_off


def test_an_undo_slurm_refuses_leaves_the_node_drained_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slurm = RaceSlurm(idle("n1", "n2", "n3", "n4"), rival="n2", fail=("resume",))
    with caplog.at_level("ERROR", logger="slurmhealth.drain"):
        got = drain_node(cfg(share=0.25), slurm, "n1", [NVLINK])
    assert got == DrainOutcome("drained", REASON, "over the limit but could not undo")
    assert got.keeps_job_off
    assert caplog.messages == [
        f"n1: could not undo a drain over the circuit-breaker limit: resume: {CTLD_DOWN}"
    ]


def test_within_the_limit_a_racing_drain_stays() -> None:
    slurm = RaceSlurm(idle("n1", "n2", "n3", "n4"), rival="n2")
    assert drain_node(cfg(share=0.5), slurm, "n1", [NVLINK]) == DrainOutcome("drained", REASON)
    assert slurm.resumes == []


def test_a_node_list_lost_after_the_drain_keeps_the_drain() -> None:
    class LostAfter(RecordingSlurm):
        reads = 0

        def nodes(self) -> list[NodeInfo]:
            self.reads += 1
            if self.reads > 1:
                self.fail.add("nodes")
            return super().nodes()

    slurm = LostAfter(idle("n1", "n2"))
    assert drain_node(cfg(), slurm, "n1", [NVLINK]) == DrainOutcome("drained", REASON)
    assert slurm.drains == [("n1", REASON)] and slurm.resumes == []


def test_nodes_drained_without_a_time_count_last_and_ties_go_by_name() -> None:
    # limit 2 of 4: n2 and n3 (both t=1: by name) count as drained first; n4, drained
    # without a reason time, sorts after them, so it is over the limit and undoes itself
    class Timeless(RecordingSlurm):
        def drain(self, node: str, reason: str) -> None:
            super().drain(node, reason)
            self.table[node] = NodeInfo(node, "drained", reason, "root", None)
            self.table["n3"] = ours("n3", at=1.0)
            self.table["n2"] = ours("n2", at=1.0)

    slurm = Timeless(idle("n1", "n2", "n3", "n4"))
    got = drain_node(cfg(share=0.5), slurm, "n4", [NVLINK])
    assert got == DrainOutcome(
        "suppressed", REASON, "circuit breaker: n2, n3 drained first (limit 2); undone"
    )


class SameSecond(RecordingSlurm):
    """Slurm stamps our drain and another node's, begun after we looked, in one second."""

    def __init__(self, nodes: list[NodeInfo], rival: str, ours_at: float, rival_at: float):
        super().__init__(nodes)
        self.rival, self.ours_at, self.rival_at = rival, ours_at, rival_at

    def drain(self, node: str, reason: str) -> None:
        super().drain(node, reason)
        self.table[node] = NodeInfo(node, "drained", reason, "root", self.ours_at)
        self.table[self.rival] = ours(self.rival, at=self.rival_at)


def test_a_racing_drain_in_the_same_second_undoes_ours_whatever_the_names() -> None:
    # n3 drained first and, looking before ours was there, kept its drain; n2's prolog sees
    # both stamped 12:00:07: by name n2 would sort first and stay (two drained, limit one)
    slurm = SameSecond(idle("n1", "n2", "n3"), rival="n3", ours_at=7.0, rival_at=7.0)
    got = drain_node(cfg(share=0.34), slurm, "n2", [NVLINK])
    assert got == DrainOutcome(
        "suppressed", REASON, "circuit breaker: n3 drained first (limit 1); undone"
    )
    assert slurm.resumes == ["n2"] and slurm.table["n2"].state == "idle"


def test_a_racing_drain_stamped_a_second_later_than_ours_leaves_ours() -> None:
    slurm = SameSecond(idle("n1", "n2", "n3"), rival="n1", ours_at=7.0, rival_at=8.0)
    assert drain_node(cfg(share=0.34), slurm, "n2", [NVLINK]) == DrainOutcome("drained", REASON)
    assert slurm.resumes == []


def test_a_reason_given_by_the_caller_is_the_one_slurm_gets_on_one_line() -> None:
    """The sweep drains with its own reason: cleaned to one line, not the findings'."""
    slurm = RecordingSlurm(idle("n1", "n2", "n3", "n4"))
    got = drain_node(cfg(), slurm, "n1", [NVLINK], reason="slurmhealth: sweep\nnode n1 slow")
    assert (got.state, got.reason) == ("drained", "slurmhealth: sweep node n1 slow")
    assert [r for _, r in slurm.drains] == ["slurmhealth: sweep node n1 slow"]


def test_an_admins_drain_over_ours_is_never_undone_by_the_breaker() -> None:
    """Between our drain and the count, an admin re-drained the node with their reason
    (and another node was drained by us): the breaker undoes only our own drain, never
    resumes a node someone else holds."""

    class Overtaken(RecordingSlurm):
        def drain(self, node: str, reason: str) -> None:
            super().drain(node, reason)
            self.table[node] = NodeInfo(node, "drained", "maint: PSU swap", "alice", 9.0)
            self.table["n3"] = ours("n3", at=8.0)

    slurm = Overtaken(idle("n1", "n2", "n3"))
    assert drain_node(cfg(share=0.34), slurm, "n2", [NVLINK]) == DrainOutcome("drained", REASON)
    assert slurm.resumes == [] and slurm.table["n2"].reason == "maint: PSU swap"
