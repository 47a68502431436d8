"""Checks on the GPU as a device: presence, reachability, driver, persistence, leftovers."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks.engine import EVERYWHERE, PRE_JOB, CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, GpuStatus, Severity


@check(
    "gpu_count",
    "The driver shows as many GPUs as configured (gpu.expected_count) and every GPU the job "
    "was allocated exists (nvidia-smi -L).",
    action=Action.DRAIN,
    hint="a GPU is missing from the PCIe bus: check `lspci | grep -i nvidia` and "
    "`dmesg | grep -i -e NVRM -e Xid`; reboot, reseat or RMA",
)
def gpu_count(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _gpu_count(ctx, th)


def _gpu_count(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    seen = ctx.snapshot.device_count
    if seen is None:
        return []
    out = []
    if ctx.expected_count and seen < ctx.expected_count:
        out.append(
            finding(
                "gpu_count",
                Severity.FAIL,
                None,
                f"{seen} GPUs visible, {ctx.expected_count} expected",
                visible=seen,
                expected=ctx.expected_count,
            )
        )
    missing = [i for i in ctx.gpus or () if i >= seen]
    if missing:
        out.append(
            finding(
                "gpu_count",
                Severity.FAIL,
                None,
                f"allocated GPU(s) {','.join(map(str, missing))} not visible ({seen} GPUs)",
                visible=seen,
                missing=missing,
            )
        )
    return out


@check(
    "gpu_lost",
    "NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus).",
    action=Action.RESET,
    hint="drain; reset the GPU (nvidia-smi -r -i N) or reboot the node; "
    "check `dmesg | grep Xid` for Xid 79; RMA if it recurs",
    phases=EVERYWHERE,
)
def gpu_lost(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _gpu_lost(ctx, th)


def _gpu_lost(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return [
        finding("gpu_lost", Severity.CRITICAL, g, "GPU is lost (fallen off the bus)", error=g.error)
        for g in ctx.snapshot.gpus
        if g.status is GpuStatus.LOST
    ]


@check(
    "gpu_reset_required",
    "NVML says the GPU needs a reset (NVML_ERROR_RESET_REQUIRED).",
    action=Action.RESET,
    hint="drain, then reset the GPU (nvidia-smi -r -i N) or reboot the node",
    phases=EVERYWHERE,
)
def gpu_reset_required(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _gpu_reset_required(ctx, th)


def _gpu_reset_required(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return [
        finding("gpu_reset_required", Severity.CRITICAL, g, "GPU requires a reset", error=g.error)
        for g in ctx.snapshot.gpus
        if g.status is GpuStatus.RESET_REQUIRED
    ]


@check(
    "gpu_unresponsive",
    "Every NVML read of the GPU finished within gpu.snapshot_timeout_s.",
    action=Action.RESET,
    hint="NVML calls hang on this GPU: capture `dmesg` and a py-spy/gdb stack, then reset "
    "the GPU or reboot; GSP timeouts (Xid 119/120) often precede this",
    phases=EVERYWHERE,
)
def gpu_unresponsive(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _gpu_unresponsive(ctx, th)


def _gpu_unresponsive(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = [
        finding("gpu_unresponsive", Severity.CRITICAL, g, f"GPU unresponsive: {g.error}")
        for g in ctx.snapshot.gpus
        if g.status is GpuStatus.UNRESPONSIVE
    ]
    return out


@check(
    "nvml_error",
    "NVML answered with an unexpected error for the GPU or one of its fields.",
    action=Action.RECORD,
    hint="look at `nvidia-smi -q -i N`; repeated errors on one GPU precede failures",
)
def nvml_error(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _nvml_error(ctx, th)


def _nvml_error(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return [
        finding(
            "nvml_error",
            Severity.WARN if g.status is GpuStatus.ERROR else Severity.INFO,
            g,
            f"NVML error: {g.error}",
        )
        for g in ctx.snapshot.gpus
        if g.error and g.status in (GpuStatus.OK, GpuStatus.ERROR)
    ]


@check(
    "driver_version",
    "The loaded NVIDIA driver is the configured one (gpu.expected_driver).",
    action=Action.DRAIN,
    hint="the node runs another driver than the fleet: reinstall the configured driver "
    "and reboot (mixed drivers break NCCL jobs across nodes)",
)
def driver_version(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _driver_version(ctx, th)


def _driver_version(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    have = ctx.snapshot.driver_version
    if not ctx.expected_driver or have is None or have == ctx.expected_driver:
        return []
    return [
        finding(
            "driver_version",
            Severity.FAIL,
            None,
            f"driver {have}, expected {ctx.expected_driver}",
            driver=have,
            expected=ctx.expected_driver,
        )
    ]


@check(
    "persistence_mode",
    "Persistence mode is on (otherwise every job pays driver init and state is lost between jobs).",
    action=Action.WARN,
    hint="enable nvidia-persistenced (or `nvidia-smi -pm 1`)",
)
def persistence_mode(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _persistence_mode(ctx, th)


def _persistence_mode(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return [
        finding("persistence_mode", Severity.WARN, g, "persistence mode is off")
        for g in readable(ctx)
        if g.persistence_mode is False
    ]


@check(
    "stale_job",
    "No process and no more than max_memory_used_mib of memory on a GPU before a job starts "
    "(judged only where no job should run: prolog, idle health check, validate; a GPU in "
    "MIG mode is judged per instance by mig_instance).",
    action=Action.DRAIN,
    hint="a previous job left processes or memory on the GPU: "
    "`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`; kill them and resume",
    thresholds={"max_memory_used_mib": 1024},
    phases=PRE_JOB,
)
def stale_job(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _stale_job(ctx, th)


def _stale_job(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        if g.mig_mode:  # its instances run other jobs: each is judged alone (mig_instance)
            continue
        pids = [p.pid for p in g.processes or ()]
        used_mib = None if g.memory_used_bytes is None else g.memory_used_bytes / 2**20
        if pids:
            out.append(
                finding(
                    "stale_job",
                    Severity.FAIL,
                    g,
                    f"{len(pids)} process(es) on the GPU before the job: pid {pids[0]}"
                    + (f" and {len(pids) - 1} more" if len(pids) > 1 else ""),
                    pids=pids,
                    memory_used_mib=used_mib,
                )
            )
        elif used_mib is not None and used_mib > th["max_memory_used_mib"]:
            out.append(
                finding(
                    "stale_job",
                    Severity.FAIL,
                    g,
                    f"{used_mib:.0f} MiB used with no process (limit "
                    f"{th['max_memory_used_mib']:g} MiB)",
                    memory_used_mib=used_mib,
                )
            )
    return out
