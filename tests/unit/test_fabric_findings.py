"""What `slurmhealth check` says of the NVSwitch fabric and IMEX: the message and evidence
of each fabric_state and imex finding, for every GPU it concerns."""

from __future__ import annotations

from dataclasses import replace

from slurmhealth.checks import CheckContext, run_checks
from slurmhealth.model import (
    FABRIC_HEALTH_FIELDS,
    Action,
    Finding,
    GpuState,
    ImexState,
    Severity,
    fabric_health,
)
from tests.unit.test_checks import ctx, healthy_gpu, node, of, only


def test_every_gpu_off_the_fabric_is_named_with_its_state() -> None:
    gone = replace(healthy_gpu(1), fabric_state=None, fabric_status=None)  # not reported
    pending = replace(healthy_gpu(3), fabric_state="in_progress", fabric_status=None)
    failed = replace(healthy_gpu(5), fabric_state="not_started", fabric_status="ok")
    found = of(run_checks(ctx(node(gone, pending, failed))), "fabric_state")
    assert [(f.gpu, f.message, f.severity) for f in found] == [
        (3, "NVSwitch fabric state in progress", Severity.FAIL),
        (5, "NVSwitch fabric state not started", Severity.FAIL),
    ]
    assert found[0].evidence == {"state": "in_progress", "status": None}
    assert found[1].evidence == {"state": "not_started", "status": "ok"}
    assert all(f.action is Action.DRAIN for f in found)


def test_a_failed_registration_names_its_status() -> None:
    gpu = replace(healthy_gpu(2), fabric_state="completed", fabric_status="Timeout")
    f = only(run_checks(ctx(node(gpu))), "fabric_state")
    assert (f.gpu, f.message) == (2, "NVSwitch fabric registration failed: Timeout")
    assert f.evidence == {"state": "completed", "status": "Timeout"}
    assert f.severity is Severity.FAIL


def _imex(state: ImexState | None) -> list[Finding]:
    snap = node()
    return of(run_checks(CheckContext(snap, imex=state)), "imex")


def test_imex_without_its_daemon_or_a_channel() -> None:
    (f,) = _imex(ImexState(daemon_running=False, channels=(), channel_dir="/dev/x"))
    assert f.message == (
        "IMEX not ready for multi-node NVLink: the nvidia-imex daemon is not running; "
        "no IMEX channel in /dev/x"
    )
    assert (f.severity, f.gpu) == (Severity.FAIL, None)
    assert f.evidence == {"daemon_running": False, "channels": [], "channel_dir": "/dev/x"}
    (f,) = _imex(ImexState(daemon_running=None, channels=()))
    assert f.message.endswith(": no IMEX channel in /dev/nvidia-caps-imex-channels")
    (f,) = _imex(ImexState(daemon_running=False, channels=("channel0",)))
    assert f.message.endswith(": the nvidia-imex daemon is not running")
    assert f.evidence["channels"] == ["channel0"]


def test_imex_ready_or_not_asked_for_is_silent() -> None:
    assert _imex(ImexState(daemon_running=True, channels=("channel0",))) == []
    assert _imex(None) == []


def mask(**fields: int) -> int:
    """A fabric health mask: every field healthy but those given (value index per field)."""
    healthy = {"degraded_bw": 2, "route_recovery": 2, "route_unhealthy": 2,
               "access_timeout_recovery": 2, "incorrect_configuration": 1,
               "partition_assigned": 1, "gfm_state": 1}  # fmt: skip
    return sum(v << FABRIC_HEALTH_FIELDS[k][0] for k, v in (healthy | fields).items())


def test_fabric_health_degraded_or_recovering_per_gpu_with_its_mask() -> None:
    def on(i: int, health: int) -> GpuState:
        return replace(healthy_gpu(i), fabric_state="completed", fabric_status="ok",
                       fabric_health_mask=health, fabric_clique_id=32766,
                       fabric_cluster_uuid="c0ffee00-0000")  # fmt: skip

    degraded = on(1, mask(degraded_bw=1, route_unhealthy=1, route_recovery=1))
    unassigned = on(2, mask(partition_assigned=2, gfm_state=2, incorrect_configuration=4))
    recovering = on(3, mask(route_recovery=1, access_timeout_recovery=1))
    fine, unknown = on(4, mask()), on(5, 0)
    no_config_field = on(6, mask(incorrect_configuration=0))  # a mask without the field
    snap = node(degraded, unassigned, recovering, fine, unknown, no_config_field)
    found = of(run_checks(ctx(snap)), "fabric_state")
    assert [(f.gpu, f.severity, f.action, f.message) for f in found] == [
        (1, Severity.FAIL, Action.DRAIN,
         "NVLink fabric health degraded: degraded_bw degraded, route_unhealthy unhealthy"),
        (2, Severity.FAIL, Action.DRAIN, "NVLink fabric health degraded: partition_assigned "
         "unassigned, gfm_state disconnected, incorrect_configuration no_partition"),
        (3, Severity.WARN, Action.WARN, "NVLink fabric health recovering: route_recovery "
         "in_progress, access_timeout_recovery in_progress"),
    ]  # fmt: skip
    assert found[0].evidence == {
        "state": "completed", "health": fabric_health(degraded.fabric_health_mask or 0),
        "health_mask": degraded.fabric_health_mask, "clique_id": 32766,
        "cluster_uuid": "c0ffee00-0000",
    }  # fmt: skip
    assert found[0].evidence["health"]["route_recovery"] == "in_progress"  # shown, not listed
