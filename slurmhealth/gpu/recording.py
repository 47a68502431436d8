"""Recording an NVML library: every call's arguments and answer (or error code), timed.

``RecordingNvml(lib)`` stands in for ``lib`` (``pynvml`` or the simulator) in front of the
adapter: ``NvmlBackend(RecordingNvml(pynvml))`` reads the GPUs as usual while each ``nvml*``
call is written down. The recording is plain JSON (format in ``docs/scenarios.md``) that
:mod:`slurmhealth.gpu.replay` answers from, so a real GPU's answers become a test fixture.

Encoding, chosen to survive a different pynvml on the replaying side:
- ctypes structures, unions and pynvml's "friendly objects" by field name, arrays as lists,
  ``bytes`` as latin-1 text; device handles as ``{"handle": index}`` and event sets as
  ``{"event_set": n}`` (pointers mean nothing in another process);
- an NVML error by its code (``NVMLError.value``), never the exception object (NVMLError
  instances are unhashable and their classes differ between pynvml releases);
- a call that never returned (a hung GPU) as ``"hang": true``.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

FORMAT = "slurmhealth.nvml-recording/1"
_BYREF = type(ctypes.byref(ctypes.c_int()))
# what a stand-in carries over from the library: constants, error classes, structures (and
# the nvml* functions, which are recorded or replayed instead)
PASSED_ON = ("NVML", "c_nvml", "nvml")


@dataclass(frozen=True)
class Named:
    """An opaque NVML object (device handle, event set) by its recorded name."""

    name: tuple[tuple[str, int], ...]


def is_nvml_function(value: Any, name: str) -> TypeGuard[Callable[..., Any]]:
    """An NVML call of the library (a pynvml function or a simulator method)."""
    return name.startswith("nvml") and (inspect.isfunction(value) or inspect.ismethod(value))


class Encoder:
    """JSON form of NVML arguments and answers; knows the opaque objects it was told about."""

    def __init__(self) -> None:
        self._names: list[tuple[Any, dict[str, int]]] = []
        self._lock = threading.Lock()

    def learn(self, obj: Any, name: dict[str, int]) -> None:
        with self._lock:
            self._names.append((obj, name))

    def _name_of(self, obj: Any) -> dict[str, int] | None:
        key = _identity(obj)
        with self._lock:
            return next((n for o, n in self._names if _identity(o) == key), None)

    def encode(self, value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, bytes):
            return {"bytes": value.decode("latin-1")}
        if isinstance(value, Named):
            return dict(value.name)
        if isinstance(value, _BYREF):
            return {"byref": True}
        name = self._name_of(value)
        if name is not None:
            return name
        if isinstance(value, ctypes.Structure | ctypes.Union):
            fields = {f[0]: self.encode(getattr(value, f[0])) for f in value._fields_}
            return {"struct": type(value).__name__, "fields": fields}
        if isinstance(value, ctypes.Array | list | tuple):
            return [self.encode(v) for v in value]
        if isinstance(value, ctypes._SimpleCData):
            return self.encode(value.value)
        if hasattr(value, "__dict__"):  # pynvml's friendly objects, the simulator's records
            fields = {k: self.encode(v) for k, v in vars(value).items() if not k.startswith("_")}
            return {"struct": type(value).__name__, "fields": fields}
        return {"repr": repr(value)}


def _identity(obj: Any) -> Any:
    """What makes two opaque objects the same: a pointer's address, else the object."""
    if isinstance(obj, ctypes._Pointer):
        return ("pointer", ctypes.cast(obj, ctypes.c_void_p).value)
    return ("object", id(obj)) if _unhashable(obj) else ("object", obj)


def _unhashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return True
    return False


class RecordingNvml:
    """``lib`` with every ``nvml*`` function recorded; everything else passed on."""

    def __init__(self, lib: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.rec_calls: list[dict[str, Any]] = []
        self.rec_clock: list[float] = []
        self.rec_functions: list[str] = []
        self._encoder = Encoder()
        self._clock = clock
        self._event_sets = 0
        self._error = lib.NVMLError
        for name in dir(lib):
            value = getattr(lib, name, None)
            if not name.startswith(PASSED_ON):
                continue
            if is_nvml_function(value, name):
                self.rec_functions.append(name)
                setattr(self, name, self._wrap(name, value))
            else:
                setattr(self, name, value)
        self.kernel_log_path = getattr(lib, "kernel_log_path", None)

    def clock(self) -> float:
        """The wall clock, recorded (the replay answers snapshots with the same times)."""
        now = self._clock()
        self.rec_clock.append(now)
        return now

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            entry: dict[str, Any] = {"fn": name, "args": [self._encoder.encode(a) for a in args]}
            entry["hang"] = True  # until it returns
            self.rec_calls.append(entry)
            t0 = time.perf_counter()
            try:
                answer = fn(*args)
            except self._error as exc:
                entry["error"] = getattr(exc, "value", None)
                raise
            except Exception as exc:
                entry["exception"] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                entry["s"] = time.perf_counter() - t0
                del entry["hang"]
                self._outputs(entry, args)
            self._learn(name, args, answer)
            entry["result"] = self._encoder.encode(answer)
            return answer

        return call

    def _outputs(self, entry: dict[str, Any], args: tuple[Any, ...]) -> None:
        """What the call wrote into structures passed by reference."""
        byref = [(n, a) for n, a in enumerate(args) if isinstance(a, _BYREF)]
        out = {str(n): self._encoder.encode(getattr(a, "_obj", None)) for n, a in byref}
        if out:
            entry["out"] = out

    def _learn(self, name: str, args: tuple[Any, ...], answer: Any) -> None:
        if name == "nvmlDeviceGetHandleByIndex":
            self._encoder.learn(answer, {"handle": int(args[0])})
        elif name == "nvmlDeviceGetMigDeviceHandleByIndex":  # a MIG device: parent + slot
            parent = self._encoder.encode(args[0])
            if isinstance(parent, dict) and "handle" in parent:
                self._encoder.learn(answer, {**parent, "mig": int(args[1])})
        elif name == "nvmlEventSetCreate":
            self._encoder.learn(answer, {"event_set": self._event_sets})
            self._event_sets += 1

    def recording(self, **meta: Any) -> dict[str, Any]:
        """The recording as a JSON-ready dict, with ``meta`` (node, library, ...) on top."""
        return {
            "format": FORMAT,
            **meta,
            "functions": sorted(self.rec_functions),
            "clock": list(self.rec_clock),
            "calls": list(self.rec_calls),
        }


def write_recording(path: str, recording: dict[str, Any]) -> None:
    """Write ``recording`` as JSON, one call per line (readable, and diffs stay small)."""
    head = {k: v for k, v in recording.items() if k != "calls"}
    lines = [json.dumps(call, sort_keys=True) for call in recording.get("calls", [])]
    text = json.dumps(head, indent=1, sort_keys=True)[:-2]
    text += ',\n "calls": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def timings(calls: list[dict[str, Any]]) -> list[tuple[str, int, float, float]]:
    """Per NVML function: (name, calls, median ms, max ms), slowest total first. Calls that
    never returned are left out (they have no duration)."""
    by_fn: dict[str, list[float]] = {}
    for call in calls:
        if "s" in call:
            by_fn.setdefault(call["fn"], []).append(float(call["s"]) * 1000)
    slowest = sorted(by_fn.items(), key=lambda item: -sum(item[1]))
    return [(fn, len(ms), statistics.median(ms), max(ms)) for fn, ms in slowest]
