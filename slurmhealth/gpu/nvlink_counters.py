"""NVLink error counters (``nvidia-smi nvlink -e``), read the way the GPU supports.

Two NVML interfaces answer the same counters:

- ``nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)``: one call per link and counter.
  Hopper and Blackwell answer NotSupported for some or all counters there.
- ``nvmlDeviceGetFieldValues(handle, [(field id, scope id), ...])``: many counters in one call,
  each with its own ``nvmlReturn``. Per-link ids scoped by link (``NVML_FI_DEV_NVLINK_ERROR_DL_
  REPLAY / _RECOVERY / _CRC`` with ``scopeId = link``, every link) are asked first, the older
  per-link ids (``NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0`` .. ``_L11``) as well.

The counter API is tried first; a counter it does not support (judged on the first link) is
read for every link through one batch of field values. The calls go through the adapter's
reader (:class:`slurmhealth.gpu.nvml._Reader`), so every error gets the same meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

LINK_COUNTERS = ("replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors")
_COUNTER_API = {
    "replay_errors": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery_errors": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit_errors": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data_errors": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}
# field ids scoped by link (scopeId = link number); NVML's "DL CRC" is the flit CRC counter
_SCOPED_FIELD = {
    "replay_errors": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "recovery_errors": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit_errors": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
}
# one field id per link (links 0..11 only), scope unused
_LINK_FIELD = {
    "replay_errors": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L{}",
    "recovery_errors": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L{}",
    "crc_flit_errors": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{}",
    "crc_data_errors": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{}",
}
# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}  # fmt: skip
_BATCH = 64  # field values per call: NVML documents no limit, so stay modest

Key = tuple[int, str]  # (link, counter)


class Reader(Protocol):
    lib: Any
    unknown: set[int]

    def attempt(self, name: str, *args: Any) -> tuple[Any, int | None]: ...

    def judge(self, name: str, code: int | None, text: str) -> None: ...


def read_link_errors(reader: Reader, handle: Any, links: Sequence[int]) -> dict[Key, int]:
    """Cumulative error counters of ``links``, keyed ``(link, counter)``; a counter neither
    interface answers is absent (unknown)."""
    lib = reader.lib
    values: dict[Key, int] = {}
    unsupported: set[str] = set()
    for link in links:
        for name in LINK_COUNTERS:
            counter = getattr(lib, _COUNTER_API[name], None)
            if name in unsupported or counter is None:
                continue
            value, code = reader.attempt("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
            if code is None and value is not None:
                values[(link, name)] = int(value)
            elif code in reader.unknown:
                unsupported.add(name)
    missing = [
        (link, name) for link in links for name in LINK_COUNTERS if (link, name) not in values
    ]
    if missing:
        values |= _from_field_values(reader, handle, missing)
    return values


def _field_requests(lib: Any, wanted: Sequence[Key]) -> list[tuple[tuple[int, int], Key]]:
    """((field id, scope id), key) for every field that can answer a wanted counter, the
    link-scoped id first."""
    out = []
    for link, name in wanted:
        scoped = getattr(lib, _SCOPED_FIELD.get(name, ""), None)
        if scoped is not None:
            out.append(((int(scoped), link), (link, name)))
        per_link = getattr(lib, _LINK_FIELD[name].format(link), None)
        if per_link is not None:
            out.append(((int(per_link), 0), (link, name)))
    return out


def _from_field_values(reader: Reader, handle: Any, wanted: Sequence[Key]) -> dict[Key, int]:
    lib = reader.lib
    ok = getattr(lib, "NVML_SUCCESS", 0)
    requests = _field_requests(lib, wanted)
    out: dict[Key, int] = {}
    for start in range(0, len(requests), _BATCH):
        chunk = requests[start : start + _BATCH]
        answer, _ = reader.attempt("nvmlDeviceGetFieldValues", handle, [f for f, _ in chunk])
        if answer is None:
            continue
        for ((field_id, scope), key), fv in zip(chunk, answer, strict=False):
            code = int(fv.nvmlReturn)
            if key in out:
                continue  # the link-scoped id answered already
            if code == ok:
                value = _value_of(fv)
                if value is not None:
                    out[key] = value
            else:
                text = str(lib.NVMLError(code))
                reader.judge(f"nvmlDeviceGetFieldValues(field {field_id}/{scope})", code, text)
    return out


def _value_of(fv: Any) -> int | None:
    member = _VALUE_MEMBER.get(int(fv.valueType))
    return None if member is None else int(getattr(fv.value, member))
