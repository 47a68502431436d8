"""The benign half of the detection-quality corpus: what healthy GPUs do that a checker
must not drain for (noise, application errors, contained errors, idle power saving)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tests.support.corpus_common import (
    DURING,
    MODERN,
    PRESETS,
    SWITCHES,
    aer,
    fault,
    field_values,
    rate,
    scenario,
    sxid,
    xid_line,
)
from tests.support.detection import CHECK_MID_JOB, GAP_S, JOB_S, Case, Line

BETWEEN = JOB_S + GAP_S / 2  # after the epilog, before the next prolog
BUSY = {"utilization_gpu": 98, "utilization_memory": 61, "memory_used_mib": 70000}


def _case(klass: str, preset: str, variant: str = "", **kw: object) -> Case:
    name = f"{klass}/{preset}" + (f"/{variant}" if variant else "")
    return Case(name=name, klass=klass, preset=preset, expect="ok", **kw)  # type: ignore[arg-type]


def _job(p: str, **fields: Any) -> dict[str, Any]:
    """The job's load on every GPU, from a minute in to a minute before the epilog."""
    top = {"h100-sxm": 5, "a100-sxm4": 4, "v100-sxm2": 3}[p]
    return fault(60, None, until=JOB_S - 60, **{**BUSY, "pcie_gen": top, **fields})


def noise(p: str) -> Iterator[Case]:
    """Counters that move a little on healthy GPUs."""
    trickle = [rate(0, [1, 6], ecc_volatile_correctable=1 / 600)]  # six an hour
    yield _case("ecc_correctable_trickle", p, scenario=scenario(p, faults=trickle))
    extra: dict[str, Any] = {"all_gpus": field_values(p)} if p == "h100-sxm" else {}
    one = [fault(BETWEEN, 2, nvlink__3__replay=1)]  # one replay, between two jobs
    yield _case("nvlink_one_replay", p, scenario=scenario(p, faults=one, **extra))
    if p == "h100-sxm":  # a burst while the link retrains between jobs: no rate
        burst = [fault(BETWEEN, 5, nvlink__9__replay=12, nvlink__9__recovery=1)]
        yield _case("nvlink_replay_burst", p, scenario=scenario(p, faults=burst, **extra))
        reset = [fault(BETWEEN, 4, nvlink__2__replay=0, nvlink__2__recovery=0, pcie_replay=0)]
        old = {"nvlink.2.replay": 57, "nvlink.2.recovery": 3, "pcie_replay": 40}
        yield _case("counters_reset_by_gpu_reset", p, scenario=scenario(
            p, gpu={4: old}, faults=reset, **extra))  # fmt: skip
    yield _case("pcie_replay_low", p, scenario=scenario(
        p, faults=[rate(0, 3, pcie_replay=1 / 900)]))  # fmt: skip


def load(p: str) -> Iterator[Case]:
    """A busy GPU under a job, checked by hand while the job runs."""
    capped = _job(p, clock_event_reasons=["sw_power_cap"], power_usage_w=690.0)
    yield _case("sw_power_cap_load", p, steps=CHECK_MID_JOB,
                scenario=scenario(p, faults=[capped]))  # fmt: skip
    hot = {"temperature": 81} | ({} if p == "v100-sxm2" else {"margin_temperature": 8})
    yield _case("thermal_swing", p, steps=CHECK_MID_JOB,
                scenario=scenario(p, faults=[_job(p, **hot)]))  # fmt: skip
    procs = [fault(60, n, until=JOB_S - 30, processes=[{"pid": 70001 + n, "used_mib": 70000}])
             for n in range(8)]  # fmt: skip
    yield _case("busy_node_checked_by_hand", p, steps=CHECK_MID_JOB,
                scenario=scenario(p, faults=[_job(p), *procs]))  # fmt: skip
    if p != "v100-sxm2":  # Ampere and Hopper drop to gen 1 when idle
        yield _case("pcie_gen_low_idle", p, steps=CHECK_MID_JOB,
                    scenario=scenario(p, all_gpus={"pcie_gen": 1}, faults=[_job(p)]))  # fmt: skip
    exiting = [fault(JOB_S - 30, 0, until=JOB_S + 2, processes=[{"pid": 70001, "used_mib": 900}])]
    yield _case("epilog_while_processes_exit", p, scenario=scenario(p, faults=exiting))


def idle(p: str) -> Iterator[Case]:
    clocks = {"clock_event_reasons": ["gpu_idle", "applications_clocks"], "sm_clock": 210}
    yield _case("idle_clocks", p, scenario=scenario(p, all_gpus=clocks))


APP_XIDS = {
    13: "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f2a_12340000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000018",
    45: "Ch 00000018",
}


def app_xids(p: str) -> Iterator[Case]:
    """Application errors: the job crashed, the GPU is fine."""
    pair = [
        fault(DURING, 1, xid=13, msg=APP_XIDS[13]),
        fault(DURING + 1, 1, xid=45, msg=APP_XIDS[45]),
    ]
    yield _case("xid_app", p, "13+45", scenario=scenario(p, faults=pair))
    yield _case(
        "xid_app",
        p,
        "31",
        scenario=scenario(p, faults=[fault(DURING, 6, xid=31, msg=APP_XIDS[31])]),
    )
    lines = tuple(Line(DURING + n, xid_line(p, n, 43, APP_XIDS[43])) for n in range(4))
    yield _case("xid_app", p, "43x4", lines=lines, scenario=scenario(p))


def contained(p: str) -> Iterator[Case]:
    """Errors the driver contained: the application dies, the GPU keeps working."""
    msg = "Contained: SM (0x1). RST: No, D-RST: No"
    yield _case("xid_94_contained", p, scenario=scenario(
        p, faults=[fault(DURING, 2, xid=94, msg=msg)]))  # fmt: skip
    yield _case(
        "old_uncorrectable_remapped",
        p,
        scenario=scenario(
            p, gpu={7: {"ecc_aggregate_uncorrectable": 2, "remapped_rows_uncorrectable": 2}}
        ),
    )


def fabric_noise(p: str) -> Iterator[Case]:
    """Warnings from the NVSwitches and the PCIe links that are not GPU faults."""
    s = SWITCHES[p]
    lines = sxid(s[0], 0, 20009, "Non-fatal", "RX Short Error Rate", 28)
    yield _case("nvswitch_sxid_nonfatal", p, scenario=scenario(p),
                lines=tuple(Line(DURING, t) for t in lines))  # fmt: skip
    corrected = aer(p, 3, "Corrected", "Physical Layer")
    yield _case("pcie_aer_corrected", p, scenario=scenario(p),
                lines=tuple(Line(DURING, t) for t in corrected))  # fmt: skip


BUILDERS = {
    noise: PRESETS,
    load: PRESETS,
    idle: ("h100-sxm",),
    app_xids: PRESETS,
    contained: MODERN,
    fabric_noise: MODERN,
}


def benign_cases() -> list[Case]:
    return [case for build, models in BUILDERS.items() for p in models for case in build(p)]
