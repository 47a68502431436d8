"""Read what training loops report through :mod:`slurmhealth.job` and summarise it.

The job dir holds one ``steps-<rank>.jsonl`` per rank of the job on this node. The reader
tails each file from where it stopped (a partial last line waits for its end, garbage lines
are skipped), keeps each rank's last ``WINDOW_STEPS`` steps, and combines ranks: throughput
(samples/s, tokens/s, FLOP/s) is each rank's sum over its window divided by its step time,
summed over the ranks, so it is this node's throughput; ratios are sums over all ranks.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slurmhealth.model import TaskStats

WINDOW_STEPS = 50
MAX_BACKLOG_BYTES = 1 << 20  # on a first read (or after falling behind) keep only the tail
FIELDS = ("step_seconds", "samples", "tokens", "flops", "comm_seconds", "data_wait_seconds")

PEAK_BF16_FLOPS: Mapping[str, float] = MappingProxyType(
    {
        # dense BF16 tensor-core peak per GPU (NVIDIA datasheets; sparse figures are 2x)
        "NVIDIA B200": 2250e12,
        "NVIDIA GH200 480GB": 989e12,
        "NVIDIA H200": 989e12,
        "NVIDIA H200 NVL": 835e12,
        "NVIDIA H100 80GB HBM3": 989e12,
        "NVIDIA H800": 989e12,
        "NVIDIA H100 NVL": 835e12,
        "NVIDIA H100 PCIe": 756e12,
        "NVIDIA A100-SXM4-80GB": 312e12,
        "NVIDIA A100-SXM4-40GB": 312e12,
        "NVIDIA A100 80GB PCIe": 312e12,
        "NVIDIA A100-PCIE-40GB": 312e12,
        "NVIDIA A800-SXM4-80GB": 312e12,
        "NVIDIA L40S": 362e12,
        "NVIDIA A10": 125e12,
    }
)
"""Dense BF16 tensor peak FLOP/s per GPU, keyed by NVML's device name."""


def peak_bf16_flops(model: str | None) -> float | None:
    """Peak dense BF16 FLOP/s for an NVML device name (``nvidia-smi --query-gpu=name``).

    Exact name first, then case-insensitively, then the longest known name the model
    starts with (``NVIDIA H200 141GB`` -> ``NVIDIA H200``). ``None`` when unknown.
    """
    if not model:
        return None
    if model in PEAK_BF16_FLOPS:
        return PEAK_BF16_FLOPS[model]
    low = model.strip().lower()
    known = {k.lower(): v for k, v in PEAK_BF16_FLOPS.items()}
    if low in known:
        return known[low]
    prefixes = [k for k in known if low.startswith(k + " ") or low.startswith(k + "-")]
    return known[max(prefixes, key=len)] if prefixes else None


peak_flops = peak_bf16_flops
"""The peak MFU is measured against (dense BF16 for now)."""


@dataclass(frozen=True)
class StepRecord:
    """One parsed line of ``steps-<rank>.jsonl``; numbers are ``None`` when not reported."""

    ts: float
    rank: int
    step: int
    step_seconds: float | None = None
    samples: float | None = None
    tokens: float | None = None
    flops: float | None = None
    comm_seconds: float | None = None
    data_wait_seconds: float | None = None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) and f >= 0 else None


def parse_line(line: bytes | str) -> StepRecord | None:
    """A :class:`StepRecord` from one JSON line, ``None`` for anything malformed."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    ts, rank, step = _num(data.get("ts")), data.get("rank"), data.get("step")
    if ts is None or not isinstance(rank, int) or not isinstance(step, int):
        return None
    if isinstance(rank, bool) or isinstance(step, bool):
        return None
    values = {name: _num(data.get(name)) for name in FIELDS}
    return StepRecord(ts=ts, rank=rank, step=step, **values)


class _Tail:
    """One rank file: the byte offset read so far and the last steps."""

    def __init__(self) -> None:
        self.offset = 0
        self.inode: int | None = None
        self.steps: deque[StepRecord] = deque(maxlen=WINDOW_STEPS)
        self.max_step = 0


class TaskReader:
    """Incremental reader of a job dir's ``steps-*.jsonl`` files.

    ``peak_flops_per_gpu`` (see :func:`peak_bf16_flops`) and ``gpus`` (the job's GPUs on
    this node) turn reported FLOPs into MFU; without a peak, MFU stays ``None``.
    """

    def __init__(self, job_dir: str, peak_flops_per_gpu: float | None, gpus: int) -> None:
        self.job_dir = job_dir
        self.peak_flops_per_gpu = peak_flops_per_gpu
        self.gpus = gpus
        self._tails: dict[str, _Tail] = {}

    def read(self, now: float) -> TaskStats | None:
        """Read what was appended since the last call and summarise the recent window.

        ``None`` when no rank has reported a step yet. ``now`` (UTC s) is the time of the
        read; the stats themselves come from the files only (``last_step_ts`` is the newest
        step of any rank, so the caller judges stalls against ``now``).
        """
        try:
            names = sorted(
                n
                for n in os.listdir(self.job_dir)
                if n.startswith("steps-") and n.endswith(".jsonl")
            )
        except OSError:
            names = []
        for name in names:
            tail = self._tails.setdefault(name, _Tail())
            self._read_file(os.path.join(self.job_dir, name), tail)
        return self._summarise(self._tails.values())

    @staticmethod
    def _read_file(path: str, tail: _Tail) -> None:
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino != tail.inode or st.st_size < tail.offset:  # new or truncated
                    tail.inode, tail.offset = st.st_ino, 0
                    tail.steps.clear()
                    tail.max_step = 0
                skip_partial = False
                if st.st_size - tail.offset > MAX_BACKLOG_BYTES:
                    tail.offset = st.st_size - MAX_BACKLOG_BYTES
                    skip_partial = True  # landed mid-line: drop up to the next newline
                fh.seek(tail.offset)
                data = fh.read(st.st_size - tail.offset)
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return  # only a partial line so far: wait for its end
        tail.offset += end + 1
        lines = data[: end + 1].split(b"\n")
        if skip_partial:
            lines = lines[1:]
        for line in lines:
            rec = parse_line(line) if line.strip() else None
            if rec is not None:
                tail.steps.append(rec)
                tail.max_step = max(tail.max_step, rec.step)

    def _summarise(self, tails: Iterable[_Tail]) -> TaskStats | None:
        tails = [t for t in tails if t.steps]
        if not tails:
            return None
        rate: dict[str, float | None] = dict.fromkeys(("samples", "tokens", "flops"))
        shares: dict[str, tuple[float, float]] = {}
        for t in tails:
            for name in rate:
                got = _sums(t.steps, name)
                if got is not None and got[1] > 0:
                    rate[name] = (rate[name] or 0.0) + got[0] / got[1]
            for name in ("comm_seconds", "data_wait_seconds"):
                got = _sums(t.steps, name)
                if got is not None:
                    part, whole = shares.get(name, (0.0, 0.0))
                    shares[name] = (part + got[0], whole + got[1])
        flops, peak = rate["flops"], self.peak_flops_per_gpu
        mfu = flops / (peak * self.gpus) if flops is not None and peak and self.gpus > 0 else None
        ratios = {k: p / w for k, (p, w) in shares.items() if w > 0}
        times = [r.step_seconds for t in tails for r in t.steps if r.step_seconds is not None]
        return TaskStats(
            steps_total=max(t.max_step for t in tails),
            step_seconds=statistics.median(times) if times else None,
            samples_per_second=rate["samples"],
            tokens_per_second=rate["tokens"],
            mfu_ratio=mfu,
            comm_ratio=ratios.get("comm_seconds"),
            data_wait_ratio=ratios.get("data_wait_seconds"),
            last_step_ts=max(t.steps[-1].ts for t in tails),
        )


def _sums(records: Iterable[StepRecord], name: str) -> tuple[float, float] | None:
    """(sum of ``name``, sum of step time) over the records that have both; None if none."""
    pairs = [
        (value, r.step_seconds)
        for r in records
        if (value := getattr(r, name)) is not None and r.step_seconds is not None
    ]
    if not pairs:
        return None
    return math.fsum(v for v, _ in pairs), math.fsum(s for _, s in pairs)
