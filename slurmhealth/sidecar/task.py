"""Read what training loops report through :mod:`slurmhealth.job` and summarise it.

The job dir holds one ``steps-<rank>.jsonl`` per rank of the job on this node. The reader
tails each file from where it stopped (a partial last line waits for its end, garbage lines
are skipped), keeps each rank's last ``WINDOW_STEPS`` steps, and combines ranks: throughput
(samples/s, tokens/s, FLOP/s) is each rank's sum over its window divided by its step time,
summed over the ranks, so it is this node's throughput; ratios are sums over all ranks.

The files are written by the job's user and read by root (DESIGN.md 5b): everything about
them is bounded. At most ``MAX_RANK_FILES`` files are followed (``MAX_SCAN_ENTRIES`` names
looked at), only regular files owned by the job's user are opened (never following a
symlink, never blocking on a FIFO), at most ``MAX_BACKLOG_BYTES`` per file and
``MAX_READ_BYTES`` in all are read per call, a line longer than ``MAX_LINE_BYTES`` or not
one flat JSON object is dropped before it is parsed, and every number is range-checked.
A dropped line is counted (``TaskReader.rejected_lines``), never fatal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slurmhealth.access import safe_read
from slurmhealth.model_records import TaskStats
from slurmhealth.sidecar.files import sweep, truncate

log = logging.getLogger("slurmhealth.sidecar")

WINDOW_STEPS = 50
MAX_LINE_BYTES = 4096  # a real record is about 250 bytes
MAX_RANK_FILES = 1024  # rank files followed per job and node; more are ignored and counted
MAX_SCAN_ENTRIES = 8 * MAX_RANK_FILES  # directory entries looked at per read
MAX_BACKLOG_BYTES = 64 << 10  # per file and read (~250 lines): when further behind, only the tail
MAX_READ_BYTES = 256 << 10  # all files together per read (CPU bound); the rest waits
COMPACT_BYTES = 1 << 20  # a rank file read to its end and this big is emptied (it appends)
FIELDS = ("step_seconds", "samples", "tokens", "flops", "comm_seconds", "data_wait_seconds")
RANGES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        # inclusive bounds; ts/rank/step out of range drop the line, the others become None
        "ts": (1.0, 1e11),  # UTC s
        "rank": (0, 2**31 - 1),
        "step": (0, 1e18),
        "step_seconds": (1e-9, 1e6),  # 0 (a step under the writer's 1 us rounding): None
        "samples": (0, 1e18),
        "tokens": (0, 1e18),
        "flops": (0, 1e30),
        "comm_seconds": (0, 1e6),
        "data_wait_seconds": (0, 1e6),
    }
)
_MAX_INT_DIGITS = 20  # an int with more digits is out of every range
_RANK_FILE = re.compile(r"steps-[0-9]{1,10}\.jsonl")
_OPEN_FLAGS = safe_read.OPEN_FLAGS

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


@dataclass(frozen=True, slots=True)
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


def _flat(line: bytes | str) -> bool:
    """One object with nothing nested, so ``json.loads`` never recurses (a line of 100,000
    ``[`` would raise RecursionError). A byte test: also true of UTF-16/32 text."""
    if isinstance(line, bytes):
        return line.count(b"{") == 1 and b"[" not in line
    return line.count("{") == 1 and "[" not in line


def _parse_int(text: str) -> int | float:
    """An int too long for every range is never built: it reads as infinity."""
    if len(text) > _MAX_INT_DIGITS:
        return -math.inf if text.startswith("-") else math.inf
    return int(text)


def _num(value: object, name: str) -> float | None:
    """``value`` as a float when it is a number within ``RANGES[name]`` (NaN never is)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    low, high = RANGES[name]
    return float(value) if low <= value <= high else None


def _int(value: object, name: str) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    low, high = RANGES[name]
    return value if low <= value <= high else None


def parse_line(line: bytes | str) -> StepRecord | None:
    """A :class:`StepRecord` from one JSON line; ``None`` for a line that is malformed,
    longer than ``MAX_LINE_BYTES``, not one flat object, or whose ``ts``, ``rank`` or
    ``step`` is missing or out of ``RANGES``. Other numbers out of range become ``None``.
    Never raises."""
    if len(line) > MAX_LINE_BYTES or not _flat(line):
        return None
    try:
        data = json.loads(line, parse_int=_parse_int)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    ts, rank = _num(data.get("ts"), "ts"), _int(data.get("rank"), "rank")
    step = _int(data.get("step"), "step")
    if ts is None or rank is None or step is None:
        return None
    values = {name: _num(data.get(name), name) for name in FIELDS}
    return StepRecord(ts=ts, rank=rank, step=step, **values)


class _Tail:
    """One rank file: the byte offset read so far and the last steps."""

    def __init__(self) -> None:
        self.offset = 0
        self.inode: int | None = None
        self.discard = False  # mid-line (skipped backlog, over-long line): drop to its end
        self.steps: deque[StepRecord] = deque(maxlen=WINDOW_STEPS)
        self.max_step = 0


class TaskReader:
    """Incremental reader of a job dir's ``steps-*.jsonl`` files.

    ``peak_flops_per_gpu`` (see :func:`peak_bf16_flops`) and ``gpus`` (the job's GPUs on
    this node) turn reported FLOPs into MFU; without a peak, MFU stays ``None``. Only files
    owned by ``uid`` are read (default: the job dir's owner, the prolog chowns it to the
    job's user). ``rejected_lines`` counts the lines dropped since the start,
    ``ignored_files`` the rank files passed over on the last read (over ``MAX_RANK_FILES``,
    not a regular file, another owner).
    """

    def __init__(
        self,
        job_dir: str,
        peak_flops_per_gpu: float | None,
        gpus: int,
        uid: int | None = None,
        max_dir_bytes: int = 64 << 20,
    ) -> None:
        self.job_dir = job_dir
        self.max_dir_bytes = max_dir_bytes
        self.peak_flops_per_gpu = peak_flops_per_gpu
        self.gpus = gpus
        self.uid = uid
        self.rejected_lines = 0
        self.ignored_files = 0
        self._tails: dict[str, _Tail] = {}
        self._reads = 0
        self._warned: set[str] = set()
        self._failed = False

    def read(self, now: float) -> TaskStats | None:
        """Read what was appended since the last call and summarise the recent window.

        ``None`` when no rank has reported a step yet. ``now`` (UTC s) is the time of the
        read; the stats themselves come from the files only (``last_step_ts`` is the newest
        step of any rank, so the caller judges stalls against ``now``). Never raises: an
        internal error is logged (with its traceback once) and reads as ``None``.
        """
        try:
            self._read_dir()
            return self._summarise(self._tails.values())
        except Exception as exc:  # the sidecar loop must survive whatever the files hold
            if not self._failed:
                log.exception("task channel %s: read failed", self.job_dir)
            else:
                log.warning("task channel %s: read failed: %r", self.job_dir, exc)
            self._failed = True
            return None

    def rank_steps(self) -> dict[int, list[StepRecord]]:
        """Each rank's steps in the current window (as of the last :meth:`read`), keyed by
        the rank its records name: the input of the task-level straggler rule
        (:func:`slurmhealth.checks.rank_straggler.rank_stragglers`)."""
        out: dict[int, list[StepRecord]] = {}
        for tail in self._tails.values():
            if tail.steps:
                out.setdefault(tail.steps[-1].rank, []).extend(tail.steps)
        return out

    def _read_dir(self) -> None:
        try:
            dir_fd = os.open(self.job_dir, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
        except OSError:
            return
        try:
            owner = self.uid if self.uid is not None else os.fstat(dir_fd).st_uid
            names, ignored = self._rank_files(dir_fd)
            budget = MAX_READ_BYTES
            start = self._reads % len(names) if names else 0
            self._reads += 1
            for name in names[start:] + names[:start]:  # rotate: a budget cut starves no rank
                if budget <= 0:
                    break
                got = self._read_file(dir_fd, name, owner, min(budget, MAX_BACKLOG_BYTES))
                if got is None:
                    ignored += 1
                budget -= got or 0
            self.ignored_files = ignored
            if sweep(dir_fd, set(names), self.max_dir_bytes):
                self._warn_once("size", f"over {self.max_dir_bytes} bytes: other files removed")
        finally:
            os.close(dir_fd)

    def _rank_files(self, dir_fd: int) -> tuple[list[str], int]:
        """The rank files to read (at most ``MAX_RANK_FILES``, the first seen stay) and how
        many others were passed over. Symlinks, FIFOs, devices and dirs are never opened."""
        names: list[str] = []
        ignored = 0
        try:
            with os.scandir(dir_fd) as entries:
                for seen, entry in enumerate(entries):
                    if seen >= MAX_SCAN_ENTRIES:
                        self._warn_once("scan", f"over {MAX_SCAN_ENTRIES} entries: rest ignored")
                        break
                    if not _RANK_FILE.fullmatch(entry.name):
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        ignored += 1
                    elif entry.name in self._tails or len(self._tails) < MAX_RANK_FILES:
                        self._tails.setdefault(entry.name, _Tail())
                        names.append(entry.name)
                    else:
                        ignored += 1
        except OSError:
            pass
        if ignored:
            self._warn_once("files", f"{ignored} rank file(s) ignored (limit, type or owner)")
        return sorted(names), ignored

    def _read_file(self, dir_fd: int, name: str, owner: int, limit: int) -> int | None:
        """Read up to ``limit`` new bytes of one rank file: bytes read, ``None`` when it is
        not a regular file of ``owner`` (re-checked on the open file: no race)."""
        tail = self._tails[name]
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            st = safe_read.check_fd(fd, name, uid=owner)
            if st.st_ino != tail.inode or st.st_size < tail.offset:  # new or truncated
                tail.inode, tail.offset, tail.discard, tail.max_step = st.st_ino, 0, False, 0
                tail.steps.clear()
            if st.st_size - tail.offset > limit:
                tail.offset, tail.discard = st.st_size - limit, True
            data = os.pread(fd, st.st_size - tail.offset, tail.offset)
        except (OSError, safe_read.Unsafe):
            return None
        finally:
            os.close(fd)
        self._take_lines(name, tail, data)
        if tail.offset == st.st_size >= COMPACT_BYTES:  # all read: empty it, keep the window
            with contextlib.suppress(OSError):
                if truncate(dir_fd, name, (st.st_ino, st.st_size)):
                    tail.offset = 0
        return len(data)

    def _take_lines(self, name: str, tail: _Tail, data: bytes) -> None:
        if tail.discard:
            nl = data.find(b"\n")
            tail.offset += len(data) if nl < 0 else nl + 1
            if nl < 0:
                return
            data, tail.discard = data[nl + 1 :], False
        end = data.rfind(b"\n")  # -1: no complete line yet
        tail.offset += end + 1
        rejected = 0
        for line in data[: max(end, 0)].split(b"\n"):
            rec = parse_line(line) if line.strip() else None
            if rec is not None:
                tail.steps.append(rec)
                tail.max_step = max(tail.max_step, rec.step)
            elif line.strip():
                rejected += 1
        if len(data) - (end + 1) > MAX_LINE_BYTES:  # a line that will never fit: drop it
            tail.offset, tail.discard = tail.offset + len(data) - (end + 1), True
            rejected += 1
        if rejected:
            self.rejected_lines += rejected
            self._warn_once("lines", f"{name}: {rejected} bad line(s) dropped")

    def _warn_once(self, key: str, what: str) -> None:
        """One log line per kind and job (the first file named, the rest counted in
        ``rejected_lines``): a writer of a thousand bad rank files cannot flood the log."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning("task channel %s: %s; later ones only counted", self.job_dir, what)

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
