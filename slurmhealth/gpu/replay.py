"""Replaying a recording: an NVML library that answers each call as the recorded GPUs did.

A scenario file with ``replay = "recording.json"`` (a path relative to the scenario file)
selects it. ``ReplayNvml`` has exactly the ``nvml*`` functions the recorded library had, and
answers every call from the recorded calls with the same function and arguments (an event
wait's timeout aside), in the recorded order: a value, an NVML error by its code, a structure
filled in by reference, or a hang until shutdown. Once they are used up the last answer
repeats, except that an event wait then times out (an event is delivered once). A call the
recording does not hold answers NotSupported and is listed in :attr:`ReplayNvml.missed`.
Snapshot times come from the recorded clock, so rates between two snapshots replay exactly.
"""

from __future__ import annotations

import json
import os
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from slurmhealth.errors import ScenarioError
from slurmhealth.gpu.recording import FORMAT, PASSED_ON, Encoder, Named, is_nvml_function

_HANG_S = 600.0  # a recorded hang blocks this long at most (or until nvmlShutdown)
REPLAY_KEYS = {"name", "description", "expect", "replay"}
# teardown answers nothing worth recording: a recording written before close lacks them
_TEARDOWN = ("nvmlShutdown", "nvmlEventSetFree")


class Record(types.SimpleNamespace):
    """A recorded structure: its fields as attributes, like the ctypes structure had."""


def decode(value: Any) -> Any:
    """The Python value of an encoded answer (see :mod:`slurmhealth.gpu.recording`)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "bytes" in value:
        return str(value["bytes"]).encode("latin-1")
    if "handle" in value or "event_set" in value:
        return Named(tuple(sorted(value.items())))
    if "struct" in value:
        return Record(**{k: decode(v) for k, v in value.get("fields", {}).items()})
    if "repr" in value:
        return value["repr"]
    return value


def _fill(obj: Any, encoded: Mapping[str, Any]) -> None:
    """Write recorded fields into a ctypes structure the caller passed by reference."""
    for name, value in encoded.get("fields", {}).items():
        decoded = decode(value)
        try:
            setattr(obj, name, decoded)
        except (TypeError, AttributeError):
            if isinstance(decoded, list):  # a ctypes array field: element by element
                target = getattr(obj, name)
                for i, item in enumerate(decoded[: len(target)]):
                    target[i] = item


# event waits: their timeout (argument 1) does not choose the answer
_EVENT_WAITS = {"nvmlEventSetWait": (1,), "nvmlEventSetWait_v2": (1,)}
_TIMED_OUT = {"error": pynvml.NVML_ERROR_TIMEOUT}  # an event is delivered once, never again


def _key(fn: str, args: list[Any]) -> str:
    """What a call is matched by: the function and its arguments (a wait's timeout aside)."""
    skip = _EVENT_WAITS.get(fn, ())
    return json.dumps([fn, [None if n in skip else a for n, a in enumerate(args)]], sort_keys=True)


class ReplayNvml:
    """Stand-in for ``pynvml`` that answers from a recording."""

    def __init__(self, recording: Mapping[str, Any], *, kernel_log_path: str = "") -> None:
        for name in dir(pynvml):
            value = getattr(pynvml, name)
            if name.startswith(PASSED_ON) and not is_nvml_function(value, name):
                setattr(self, name, value)
        self._answers: dict[str, list[Mapping[str, Any]]] = {}
        for call in recording["calls"]:
            self._answers.setdefault(_key(call["fn"], call["args"]), []).append(call)
        self._served: dict[str, int] = {}
        self._times = [float(t) for t in recording.get("clock", [])]
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._encoder = Encoder()
        self.missed: list[str] = []
        for name in recording["functions"]:
            setattr(self, name, self._answerer(name))
        self.kernel_log_path = kernel_log_path or None
        if kernel_log_path:  # an empty simulated kernel log: the recording holds none
            try:
                os.makedirs(os.path.dirname(kernel_log_path) or ".", exist_ok=True)
                open(kernel_log_path, "a").close()
            except OSError:
                pass

    def clock(self) -> float:
        """The recorded wall-clock readings in order (the last one repeats)."""
        with self._lock:
            if not self._times:
                return time.time()
            n = self._served.get("clock", 0)
            self._served["clock"] = n + 1
            return self._times[min(n, len(self._times) - 1)]

    def _answerer(self, name: str) -> Callable[..., Any]:
        def answer(*args: Any) -> Any:
            key = _key(name, [self._encoder.encode(a) for a in args])
            with self._lock:
                calls = self._answers.get(key)
                if not calls and name in _TEARDOWN:
                    calls = [{"result": None}]
                elif not calls:
                    self.missed.append(key)
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                n = self._served.get(key, 0)
                self._served[key] = n + 1
            if n >= len(calls) and name in _EVENT_WAITS:
                calls = [_TIMED_OUT]
            if name == "nvmlInit":
                self._release.clear()
            elif name == "nvmlShutdown":
                self._release.set()
            return self._replay(calls[min(n, len(calls) - 1)], args)

        return answer

    def _replay(self, call: Mapping[str, Any], args: tuple[Any, ...]) -> Any:
        if call.get("hang"):
            self._release.wait(_HANG_S)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        for n, encoded in call.get("out", {}).items():
            _fill(args[int(n)]._obj, encoded)
        if "error" in call:
            raise pynvml.NVMLError(call["error"])
        if "exception" in call:
            raise RuntimeError(f"recorded: {call['exception']}")
        return decode(call.get("result"))


def load_recording(path: str) -> dict[str, Any]:
    """Read and check a recording; raises ``ValueError`` saying what is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"recording {path} not found") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"recording {path} unreadable: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"recording {path} is not a {FORMAT} file")
    calls, functions = data.get("calls"), data.get("functions")
    if not isinstance(functions, list) or not all(isinstance(f, str) for f in functions):
        raise ValueError(f"recording {path}: 'functions' must be a list of names")
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("fn"), str) and isinstance(c.get("args"), list)
        for c in calls
    ):
        raise ValueError(f"recording {path}: every call needs 'fn' and 'args'")
    return data


def replay_path(src: str, data: Mapping[str, Any]) -> str:
    """The recording a replay scenario points at (relative to the scenario file), checked;
    raises :class:`ScenarioError` naming the scenario file and key."""
    extra = sorted(set(data) - REPLAY_KEYS)
    if extra:
        raise ScenarioError(src, extra[0], "a replay scenario takes only name, description, "
                            "expect and replay")  # fmt: skip
    value = data["replay"]
    if not isinstance(value, str) or not value:
        raise ScenarioError(src, "replay", "expected the path of a recording")
    path = os.path.join(os.path.dirname(os.path.abspath(src)), value)
    try:
        load_recording(path)
    except ValueError as exc:
        raise ScenarioError(src, "replay", str(exc)) from None
    return path
