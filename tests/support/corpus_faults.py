"""The fault half of the detection-quality corpus: every fault class the catalog detects, on
each GPU model it exists on, mild and severe. Each case names the GPUs to blame."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from tests.support.corpus_common import (
    DURING,
    MODERN,
    NVLINKS,
    PRESETS,
    SWITCHES,
    aer,
    blame,
    buses,
    fallen_off,
    fault,
    field_values,
    rate,
    scenario,
    sxid,
    xid_line,
)
from tests.support.detection import CHECK_MID_JOB, JOB_S, Case, Line

# the GPU a fault hits, per model, so the corpus does not always blame the same index
ONE = {"h100-sxm": 3, "a100-sxm4": 5, "v100-sxm2": 2}
TWO = {"h100-sxm": (1, 6), "a100-sxm4": (0, 7), "v100-sxm2": (4, 5)}


def _case(klass: str, preset: str, level: str, expect: str = "drain", **kw: object) -> Case:
    return Case(name=f"{klass}/{preset}/{level}", klass=klass, preset=preset, expect=expect,
                **kw)  # type: ignore[arg-type]  # fmt: skip


def nvlink_down(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    last = NVLINKS[p] - 1
    yield _case("nvlink_down", p, "mild", blame=blame(p, g),
                scenario=scenario(p, gpu={g: {f"nvlink.{last}.state": "inactive"}}))  # fmt: skip
    down: dict[str, Any] = {f"nvlink__{n}__state": "inactive" for n in (0, 2, 3)}
    msg = "NVLink: fatal error detected on link 2(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
    yield _case("nvlink_down", p, "severe", blame=blame(p, a, b), scenario=scenario(
        p, faults=[fault(DURING, [a, b], xid=74, msg=msg, **down)]))  # fmt: skip


def nvlink_errors(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    extra: dict[str, Any] = {"all_gpus": field_values(p)} if p == "h100-sxm" else {}
    mild = [rate(0, g, nvlink__4__replay=1.2 / 60)]  # just over 1 a minute, all job long
    yield _case("nvlink_errors", p, "mild", blame=blame(p, g),
                scenario=scenario(p, faults=mild, **extra))  # fmt: skip
    severe = [
        rate(DURING, a, nvlink__1__replay=5.0, nvlink__1__recovery=0.5),
        rate(DURING, b, nvlink__5__crc_flit=400.0, nvlink__5__crc_data=120.0),
    ]
    yield _case("nvlink_errors", p, "severe", blame=blame(p, a, b),
                scenario=scenario(p, faults=severe, **extra))  # fmt: skip


def gpu_lost_xid79(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    msg = "GPU has fallen off the bus."
    yield _case("gpu_lost_xid79", p, "mild", blame=blame(p, g), scenario=scenario(
        p, faults=[fault(DURING, g, xid=79, msg=msg, lost=True)]))  # fmt: skip
    lines = [Line(0, f"NVRM: GPU {buses(p)[n]}: GPU has fallen off the bus.") for n in (a, b)]
    yield _case(
        "gpu_lost_xid79",
        p,
        "severe",
        blame=blame(p, a, b),
        lines=tuple(lines),
        scenario=scenario(p, faults=[fault(0, [a, b], xid=79, msg=msg, lost=True)]),
    )


def other_job(p: str) -> Iterator[Case]:
    """The node runs 4-GPU jobs: a fault on a GPU of the other half shows in the kernel log
    that this job's epilog reads (and whose cursor it moves on)."""
    msg = "GPU has fallen off the bus."
    lost = fault(DURING, 6, xid=79, msg=msg, lost=True)
    yield _case("gpu_lost_xid79", p, "other_job", blame=blame(p, 6), job_gpus=(0, 1, 2, 3),
                scenario=scenario(p, faults=[lost]))  # fmt: skip


def gpu_lost_no_xid(p: str) -> Iterator[Case]:
    """Fallen off the bus with no Xid line: only the driver's multi-line message."""
    g, (a, _) = ONE[p], TWO[p]
    mild = tuple(Line(DURING, t) for t in fallen_off(p, g, "record"))
    yield _case("gpu_lost_no_xid", p, "mild", blame=blame(p, g), lines=mild,
                scenario=scenario(p, faults=[fault(DURING, g, lost=True)]))  # fmt: skip
    style = "old" if p == "v100-sxm2" else "lines"
    severe = tuple(Line(DURING, t) for t in fallen_off(p, a, style))
    yield _case("gpu_lost_no_xid", p, "severe", blame=blame(p, a), lines=severe,
                scenario=scenario(p, faults=[fault(DURING, a, lost=True)]))  # fmt: skip
    if p == "h100-sxm":  # the driver gave the GPU up: NVML enumerates the 7 others
        gone = 3
        rest = {i: {"pci_bus_id": buses(p)[i + 1].upper().replace("0000:", "00000000:", 1)}
                for i in range(gone, 7)}  # fmt: skip
        lines = tuple(Line(0, t) for t in fallen_off(p, gone, "record"))
        yield _case("gpu_lost_no_xid", p, "gone", blame=blame(p, gone), lines=lines,
                    scenario=scenario(p, gpus=7, gpu=rest))  # fmt: skip


def reset_required(p: str) -> Iterator[Case]:
    g = ONE[p]
    yield _case("reset_required", p, "mild", blame=blame(p, g),
                scenario=scenario(p, gpu={g: {"reset_required": True}}))  # fmt: skip
    three = (0, 2, 7)
    yield _case(
        "reset_required",
        p,
        "severe",
        blame=blame(p, *three),
        scenario=scenario(p, faults=[fault(DURING, three, reset_required=True)]),
    )


def gpu_hang(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    yield _case(
        "gpu_hang",
        p,
        "mild",
        blame=blame(p, g),
        scenario=scenario(p, faults=[fault(DURING, g, hang=True, hang_s=600.0)]),
    )
    yield _case("gpu_hang", p, "severe", blame=blame(p, a, b),
                scenario=scenario(p, gpu={a: {"hang": True}, b: {"hang": True}}))  # fmt: skip


def ecc_uncorrectable(p: str) -> Iterator[Case]:
    g, a = ONE[p], TWO[p][0]
    yield _case("ecc_uncorrectable", p, "mild", blame=blame(p, g), scenario=scenario(
        p, faults=[fault(DURING, g, ecc_volatile_uncorrectable=1)]))  # fmt: skip
    pending = {"retired_pages_pending": True} if p == "v100-sxm2" else {"remap_pending": True}
    msg = "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer"
    severe = fault(DURING, a, xid=48, msg=msg, ecc_volatile_uncorrectable=16,
                   ecc_aggregate_uncorrectable=16, **pending)  # fmt: skip
    yield _case("ecc_uncorrectable", p, "severe", blame=blame(p, a),
                scenario=scenario(p, faults=[severe]))  # fmt: skip


def row_remap(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    msg = "Row Remapper: New row (0x00000000005b9a40) marked for remapping, reset gpu to activate."
    yield _case("row_remap_pending", p, "mild", blame=blame(p, g), scenario=scenario(
        p, faults=[fault(DURING, g, xid=63, msg=msg, remap_pending=True,
                         remapped_rows_uncorrectable=1)]))  # fmt: skip
    yield _case("row_remap_pending", p, "severe", blame=blame(p, a, b), scenario=scenario(
        p, all_gpus={"remapped_rows_correctable": 3},
        gpu={a: {"remap_pending": True}, b: {"remap_pending": True}}))  # fmt: skip
    contained = "Contained: SM (0x1). RST: No, D-RST: No"  # the remap waits for a reset
    yield _case("row_remap_pending", p, "after_xid94", blame=blame(p, g), scenario=scenario(
        p, faults=[fault(DURING, g, xid=94, msg=contained, remap_pending=True)]))  # fmt: skip
    yield _case("row_remap_failure", p, "mild", blame=blame(p, g), scenario=scenario(
        p, gpu={g: {"remap_failure": True, "remapped_rows_uncorrectable": 8}}))  # fmt: skip
    fail = "Row Remapper: Failed to remap row, no spare rows left in bank"
    yield _case("row_remap_failure", p, "severe", blame=blame(p, a), scenario=scenario(
        p, faults=[fault(DURING, a, xid=64, msg=fail, remap_failure=True)]))  # fmt: skip


def retired_pages(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    msg = "Dynamic Page Retirement: New page retired, reboot to activate (0x00000000003c8f1a)."
    yield _case("retired_pages", p, "mild", blame=blame(p, g), scenario=scenario(
        p, faults=[fault(DURING, g, xid=63, msg=msg, retired_pages_pending=True)]))  # fmt: skip
    yield _case("retired_pages", p, "severe", blame=blame(p, a, b), scenario=scenario(
        p, gpu={n: {"retired_pages_pending": True, "ecc_aggregate_uncorrectable": 2}
                for n in (a, b)}))  # fmt: skip


def pcie_downgrade(p: str) -> Iterator[Case]:
    """Warn-level: a narrower link at any time, a lower generation under load."""
    g, a = ONE[p], TWO[p][0]
    yield _case("pcie_downgrade", p, "mild", "warn", blame=blame(p, g), checks=("pcie_link",),
                scenario=scenario(p, gpu={g: {"pcie_width": 8}}))  # fmt: skip
    top = {"h100-sxm": 5, "a100-sxm4": 4, "v100-sxm2": 3}[p]
    busy = fault(60, None, until=JOB_S - 60, utilization_gpu=97, pcie_gen=top)
    slow = fault(60, a, until=JOB_S - 60, pcie_gen=top - 2)
    idle = {"pcie_gen": 1} if p != "v100-sxm2" else {}
    yield _case(
        "pcie_downgrade",
        p,
        "severe",
        "warn",
        blame=blame(p, a),
        checks=("pcie_link",),
        steps=CHECK_MID_JOB,
        scenario=scenario(p, all_gpus=idle, faults=[busy, slow]),
    )


def clock_hw(p: str) -> Iterator[Case]:
    g = ONE[p]
    yield _case(
        "clock_hw_sustained",
        p,
        "mild",
        blame=blame(p, g),
        scenario=scenario(
            p, faults=[fault(DURING, g, clock_event_reasons=["gpu_idle", "hw_power_brake"])]
        ),
    )
    hot = {"clock_event_reasons": ["hw_slowdown", "hw_thermal"], "sm_clock": 600}
    yield _case("clock_hw_sustained", p, "severe", blame=blame(p, *range(8)),
                scenario=scenario(p, all_gpus=hot))  # fmt: skip


def thermal(p: str) -> Iterator[Case]:
    g, (a, b) = ONE[p], TWO[p]
    yield _case("thermal_margin", p, "mild", blame=blame(p, g), scenario=scenario(
        p, faults=[fault(DURING, g, temperature=87, margin_temperature=0)]))  # fmt: skip
    hot = {"temperature": 91, "margin_temperature": -4}
    yield _case("thermal_margin", p, "severe", blame=blame(p, a, b),
                scenario=scenario(p, gpu={a: hot, b: hot}))  # fmt: skip
    yield _case("thermal_margin_low", p, "mild", "warn", blame=blame(p, g),
                checks=("thermal_margin",), scenario=scenario(
                    p, gpu={g: {"temperature": 83, "margin_temperature": 4}}))  # fmt: skip
    yield _case("thermal_margin_low", p, "severe", "warn", blame=blame(p, a, b),
                checks=("thermal_margin",), scenario=scenario(p, faults=[
                    fault(DURING, [a, b], temperature=86, margin_temperature=1)]))  # fmt: skip


def node_level(p: str) -> Iterator[Case]:
    """Faults of the node, not of one GPU: the driver, a missing GPU."""
    yield _case("driver_mismatch", p, "mild",
                scenario=scenario(p, driver_version="550.90.12"))  # fmt: skip
    yield _case("driver_mismatch", p, "severe", scenario=scenario(
        p, driver_version="535.104.05", nvml_version="12.535.104.05"))  # fmt: skip
    yield _case("gpu_missing", p, "mild", scenario=scenario(p, gpus=7))
    renumbered = {i: {"pci_bus_id": buses(p)[i + 2].upper().replace("0000:", "00000000:", 1)}
                  for i in range(2, 6)}  # fmt: skip
    yield _case("gpu_missing", p, "severe", scenario=scenario(p, gpus=6, gpu=renumbered))


def fabric(p: str) -> Iterator[Case]:
    g = ONE[p]
    yield _case("fabric_incomplete", p, "mild", blame=blame(p, g),
                scenario=scenario(p, gpu={g: {"fabric_state": "in_progress"}}))  # fmt: skip
    down = {"fabric_state": "not_started", "fabric_status": "not_ready"}
    yield _case("fabric_incomplete", p, "severe", blame=blame(p, *range(8)),
                scenario=scenario(p, all_gpus=down))  # fmt: skip


def stale_process(p: str) -> Iterator[Case]:
    """A process the last job left behind: the epilog does not judge it, the next prolog
    must."""
    g, (a, b) = ONE[p], TWO[p]
    left = fault(JOB_S - 10, g, processes=[{"pid": 48213, "used_mib": 612}], memory_used_mib=612)
    yield _case("stale_process", p, "mild", blame=blame(p, g), scenario=scenario(p, faults=[left]))
    procs = [fault(JOB_S - 10, n, processes=[{"pid": 48213 + n, "used_mib": 20480}],
                   memory_used_mib=20480) for n in (a, b)]  # fmt: skip
    yield _case("stale_process", p, "severe", blame=blame(p, a, b),
                scenario=scenario(p, faults=procs))  # fmt: skip


# Xid -> (GPU models it exists on, the message of a typical line)
XIDS: dict[int, tuple[tuple[str, ...], str]] = {
    48: (PRESETS, "An uncorrectable double bit error (DBE) has been detected on GPU in the "
         "framebuffer at partition 6, subpartition 0."),
    62: (PRESETS, "Internal micro-controller halt (newer drivers)"),
    64: (PRESETS, "ECC page retirement or row remapper recording failure"),
    74: (PRESETS, "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, "
         "0x0)"),
    95: (MODERN, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
    119: (MODERN, "Timeout after 6s of waiting for RPC response from GPU{n} GSP! Expected "
          "function 76 (GSP_RM_CONTROL) sequence 1321 (0x20800a4c 0x4)."),
    120: (MODERN, "GSP task exception: GSP task timeout @ pc:0x4b74bd8, partition:0x00000000"),
    140: (("h100-sxm",), "An unrecovered ECC error has been detected on GPU in the framebuffer"),
    154: (MODERN, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
}  # fmt: skip


def xids(p: str) -> Iterator[Case]:
    """Each acting Xid: mild as the simulator's event (one GPU, during the job), severe as
    lines of another driver generation (MIG instance or no pid/name) on two GPUs."""
    g, (a, b) = ONE[p], TWO[p]
    for code, (models, msg) in XIDS.items():
        if p not in models:
            continue
        klass = f"xid_{code}"
        yield _case(klass, p, "mild", blame=blame(p, g), scenario=scenario(
            p, faults=[fault(DURING, g, xid=code, msg=msg.format(n=g))]))  # fmt: skip
        lines = []
        for n in (a, b):
            line = xid_line(p, n, code, msg.format(n=n), pid=p != "v100-sxm2")
            if p == "a100-sxm4" and code in (48, 95):  # MIG: the GPU instance in the prefix
                line = line.replace("): ", " GPU-I:02): ", 1)
            lines.append(Line(DURING, line))
        yield _case(klass, p, "severe", blame=blame(p, a, b), lines=tuple(lines),
                    scenario=scenario(p))  # fmt: skip


def gsp_timeout(p: str) -> Iterator[Case]:
    """GSP firmware timeouts without an Xid line."""
    g, a = ONE[p], TWO[p][0]
    lines = (
        f"NVRM: GPU{g} _kgspIsHeartbeatTimedOut: Heartbeat timed out, curTime 0x1d9f3b2c "
        "lastHeartbeatTime 0x1d9f0000 diff 5200 timeout 5200 [ms]",
        f"NVRM: GPU{g} _kgspRpcRecvPoll: GSP RM heartbeat timed out",
    )
    yield _case("gsp_timeout", p, "mild", blame=blame(p, g),
                lines=tuple(Line(DURING, t) for t in lines), scenario=scenario(p))  # fmt: skip
    severe = (
        "NVRM: ********************************* GSP Timeout **********************************",
        "NVRM: Note: Please also check logs above.",
        f"NVRM: GPU{a} _kgspRpcRecvPoll: LibOS heartbeat timed out",
    )
    yield _case("gsp_timeout", p, "severe", blame=blame(p, a),
                lines=tuple(Line(DURING, t) for t in severe), scenario=scenario(p))  # fmt: skip


def nvswitch(p: str) -> Iterator[Case]:
    s = SWITCHES[p]
    mild = sxid(s[1], 1, 20034, "Fatal", "LTSSM Fault Up", 48)
    yield _case("nvswitch_sxid_fatal", p, "mild", scenario=scenario(p),
                lines=tuple(Line(DURING, t) for t in mild))  # fmt: skip
    severe = [
        t
        for n in (0, 2)
        for t in sxid(s[n], n, 24007, "Fatal", "sourcetrack timeout error (First)", 40 + n)
    ]
    yield _case("nvswitch_sxid_fatal", p, "severe", scenario=scenario(p),
                lines=tuple(Line(0, t) for t in severe))  # fmt: skip


def pcie_aer_fatal(p: str) -> Iterator[Case]:
    g, a = ONE[p], TWO[p][0]
    mild = aer(p, g, "Uncorrected (Fatal)")
    yield _case("pcie_aer_fatal", p, "mild", blame=blame(p, g), scenario=scenario(p),
                lines=tuple(Line(DURING, t) for t in mild))  # fmt: skip
    severe = [*aer(p, a, "Uncorrected (Fatal)", "Inaccessible"),
              xid_line(p, a, 79, "GPU has fallen off the bus.")]  # fmt: skip
    yield _case("pcie_aer_fatal", p, "severe", blame=blame(p, a),
                lines=tuple(Line(DURING, t) for t in severe),
                scenario=scenario(p, faults=[fault(DURING, a, lost=True)]))  # fmt: skip


BUILDERS: dict[Callable[[str], Iterator[Case]], tuple[str, ...]] = {
    nvlink_down: PRESETS, nvlink_errors: PRESETS, gpu_lost_xid79: PRESETS,
    other_job: MODERN, gpu_lost_no_xid: PRESETS, reset_required: PRESETS, gpu_hang: PRESETS,
    ecc_uncorrectable: PRESETS, row_remap: MODERN, retired_pages: ("v100-sxm2",),
    pcie_downgrade: PRESETS, clock_hw: PRESETS, thermal: MODERN, node_level: PRESETS,
    fabric: ("h100-sxm",), stale_process: PRESETS, xids: PRESETS, gsp_timeout: MODERN,
    nvswitch: MODERN, pcie_aer_fatal: PRESETS,
}  # fmt: skip
"""Which GPU models each fault class exists on: row remapping from Ampere on (V100 retires
pages), the margin temperature and GSP firmware on Ampere and Hopper, fabric registration
in NVML on Hopper, NVSwitches on the HGX A100 and H100 boards (V100 SXM2 links GPU to GPU)."""


def fault_cases() -> list[Case]:
    return [case for build, models in BUILDERS.items() for p in models for case in build(p)]
