"""The history's schema: tables and columns, indexes, forward migrations, JSON columns.

Current schema: table -> column -> type. A migration that adds columns updates ``COLUMNS``.
Migrations receive a ``sqlite_utils.Database`` inside an open transaction and are applied
in ascending order, each recorded in ``schema_migrations`` and ``PRAGMA user_version``.
Before the first migration of an existing database it is copied to ``<db>.bak-v<old>``
(``History``); a database whose version is above :func:`latest_version` is refused
(:func:`check_version`): a rolled-back binary never writes to a newer schema.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from slurmhealth.errors import SchemaTooNew

Migration = Callable[[Any], None]
"""A migration receives a ``sqlite_utils.Database`` inside an open transaction."""

MIGRATIONS: dict[int, tuple[str, Migration]] = {}
_T, _I, _R = "TEXT", "INTEGER", "REAL"


def migration(version: int, name: str) -> Callable[[Migration], Migration]:
    """Register a forward migration. Versions are unique and applied in ascending order."""

    def register(fn: Migration) -> Migration:
        if version in MIGRATIONS:
            raise ValueError(f"duplicate migration version {version}")
        MIGRATIONS[version] = (name, fn)
        return fn

    return register


COLUMNS: dict[str, dict[str, str]] = {
    "check_runs": {"run_id": _T, "ts": _R, "node": _T, "job_id": _T, "phase": _T, "gpus": _T,
                   "status": _T, "exit_code": _I, "duration_s": _R, "backend": _T, "error": _T},
    "findings": {"id": _I, "run_id": _T, "ts": _R, "node": _T, "job_id": _T, "check_name": _T,
                 "severity": _T, "severity_value": _I, "gpu": _I, "uuid": _T, "message": _T,
                 "action": _T, "hint": _T, "evidence": _T},
    "drains": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "run_id": _T, "state": _T,
               "reason": _T, "actor": _T, "detail": _T},
    "jobs": {"job_id": _T, "node": _T, "user": _T, "uid": _I, "account": _T, "partition": _T,
             "qos": _T, "priority": _I, "nodes": _T, "gpus": _T, "start_ts": _R, "end_ts": _R,
             "exit_code": _T, "state": _T},
    "events": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "gpu": _I, "uuid": _T, "kind": _T,
               "severity": _T, "message": _T, "evidence": _T},
    "samples": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "gpu": _I, "uuid": _T,
                "metrics": _T, **{c: t for c, t in (
                    ("util_pct", _R), ("power_w", _R), ("mem_used_bytes", _I), ("temp_c", _R),
                    ("margin_c", _R), ("clock_reasons", _I), ("pcie_gen", _I),
                    ("pcie_width", _I), ("nvlink_active", _I), ("nvlink_errors", _I),
                    ("pcie_replay", _I), ("mem_util_pct", _R), ("power_limit_w", _R),
                    ("energy_j", _R), ("sm_clock_mhz", _R), ("ecc_uncorrectable", _I),
                    ("remapped_uncorrectable", _I), ("status", _T))}},
    "evidence": {"id": _I, "ts": _R, "job_id": _T, "node": _T, "path": _T, "sha256": _T,
                 "size": _I, "kind": _T},
    "baselines": {"id": _I, "ts": _R, "node": _T, "kind": _T, "metric": _T, "value": _R,
                  "unit": _T, "gpu_model": _T, "gpu": _I, "label": _T, "source": _T,
                  "printed": _T},
    "kv": {"key": _T, "value": _T, "updated": _R},
    # one step of a node's automatic repair (hooks/remediate.py): reset, validate, reboot,
    # resume, service_required; ``job_id`` the job that met the fault (from its drain)
    "remediations": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "gpus": _T, "fault": _T,
                     "action": _T, "started": _R, "ended": _R, "outcome": _T, "detail": _T},
}  # fmt: skip
PRIMARY_KEYS = {"check_runs": "run_id", "jobs": "job_id", "kv": "key"}  # others: "id"
JSON_COLUMNS = {"check_runs": ("gpus",), "findings": ("evidence",), "drains": ("detail",),
                "events": ("evidence",), "samples": ("metrics",), "kv": ("value",),
                "jobs": ("gpus",), "remediations": ("gpus", "detail")}  # fmt: skip
INDEXES: dict[str, list[tuple[str, ...]]] = {
    "check_runs": [("node", "ts"), ("job_id",), ("ts",)],
    "findings": [("run_id",), ("node", "ts"), ("job_id",)],
    "drains": [("node", "ts"), ("job_id",)],
    "jobs": [("node", "start_ts")],
    "events": [("node", "ts"), ("job_id",)],
    "samples": [("job_id", "node", "gpu", "ts"), ("ts",)],
    "evidence": [("job_id",)],
    "baselines": [("node", "kind", "metric", "ts")],
    "remediations": [("node", "ts"), ("job_id",)],
}
# a GPU sample's fields -> their ``samples`` columns (since migration 3 a GPU row's
# ``metrics`` JSON holds only fields without a column, usually none: NULL)
SAMPLE_COLUMNS = {
    "utilization_gpu_pct": "util_pct", "power_w": "power_w",
    "memory_used_bytes": "mem_used_bytes", "temperature_c": "temp_c",
    "margin_temperature_c": "margin_c", "clock_event_reasons": "clock_reasons",
    "pcie_gen": "pcie_gen", "pcie_width": "pcie_width", "nvlink_active": "nvlink_active",
    "nvlink_errors": "nvlink_errors", "pcie_replay_errors": "pcie_replay",
    "utilization_memory_pct": "mem_util_pct", "power_limit_w": "power_limit_w",
    "energy_j": "energy_j", "sm_clock_mhz": "sm_clock_mhz",
    "ecc_volatile_uncorrectable": "ecc_uncorrectable",
    "remapped_rows_uncorrectable": "remapped_uncorrectable", "status": "status",
}  # fmt: skip


@migration(1, "initial schema")
def _initial_schema(db: Any) -> None:
    for table, columns in COLUMNS.items():
        db[table].create(dict(columns), pk=PRIMARY_KEYS.get(table, "id"))
        for cols in INDEXES.get(table, []):
            db[table].create_index(list(cols), if_not_exists=True)


@migration(2, "sample metrics as columns")
def _sample_columns(db: Any) -> None:
    """The report aggregates a day of samples in SQL: json_extract re-parses the JSON for
    every call (12 per row), real columns are ~10x faster."""
    have = set(db["samples"].columns_dict)
    for column, kind in COLUMNS["samples"].items():
        if column not in have:
            db["samples"].add_column(column, {"INTEGER": int, "REAL": float}.get(kind, str))
    # covering index: the report reads one job's samples of one node in (gpu, ts) order
    # from the index alone, without a sort or a table lookup per row (2.3x faster)
    db["samples"].create_index(
        ["job_id", "node", "gpu", "ts", "util_pct", "power_w", "clock_reasons", "uuid",
         "mem_used_bytes", "temp_c", "margin_c", "pcie_gen", "pcie_width", "nvlink_active",
         "nvlink_errors", "pcie_replay"],
        index_name="idx_samples_report",
        if_not_exists=True,
    )  # fmt: skip


@migration(3, "samples without the JSON duplicate; per-GPU rollups")
def _rollups(db: Any) -> None:
    """A GPU sample's ``metrics`` JSON repeated its columns (82% of the file): the fields
    without a column get one, the JSON keeps only what no column holds (NULL when that is
    nothing); the report's covering index gives way to ``sample_rollups`` (``rollups.py``).
    Jobs sampled before this have no rollups: their readers recount the raw samples."""
    have = set(db["samples"].columns_dict)
    for column, kind in COLUMNS["samples"].items():
        if column not in have:
            db["samples"].add_column(column, {"INTEGER": int, "REAL": float}.get(kind, str))
    sets = "".join(
        f", {quote(c)} = coalesce({quote(c)}, json_extract(metrics, '$.{k}'))"
        for k, c in SAMPLE_COLUMNS.items()
    )
    paths = ", ".join(f"'$.{k}'" for k in SAMPLE_COLUMNS)
    db.execute(
        f"UPDATE samples SET metrics = nullif(json_remove(metrics, {paths}), '{{}}'){sets}"
        " WHERE gpu IS NOT NULL AND json_valid(metrics)"
    )
    for name in ("idx_samples_report", "idx_samples_node_ts", "idx_samples_job_id"):
        db.execute(f"DROP INDEX IF EXISTS {quote(name)}")
    for cols in INDEXES["samples"]:
        db["samples"].create_index(list(cols), if_not_exists=True)
    from slurmhealth.history.rollups import CREATE_SQL

    for sql in CREATE_SQL:
        db.execute(sql)


@migration(4, "remediation steps")
def _remediations(db: Any) -> None:
    """The ``remediations`` table (a database made by migration 1 of this release has it)."""
    if "remediations" not in db.table_names():
        db["remediations"].create(dict(COLUMNS["remediations"]), pk="id")
    for cols in INDEXES["remediations"]:
        db["remediations"].create_index(list(cols), if_not_exists=True)


@migration(5, "baselines keep the value as the tool printed it")
def _baseline_printed(db: Any) -> None:
    """perftest prints MB/sec, MiB/sec or Gb/sec: ``value`` is converted (Gb/s), ``printed``
    keeps the tool's own number and unit (``46742.18 MiB/sec``); NULL for older rows."""
    table = db["baselines"]
    if table.exists() and "printed" not in table.columns_dict:
        db["baselines"].add_column("printed", str)


def latest_version() -> int:
    return max(MIGRATIONS)


def check_version(path: str, found: int) -> None:
    """Raise :class:`SchemaTooNew` when ``found`` (the file's ``user_version``) is newer
    than every migration this release knows: an older binary never uses a newer database."""
    if found > latest_version():
        raise SchemaTooNew(path, found, latest_version())


def sql_value(value: Any) -> Any:
    """A Python value as sqlite stores it: JSON for containers, text for the rest."""
    kind = type(value)
    if kind is float or kind is str or value is None:  # most values: the fast way
        return value
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return str(value)  # too big for an sqlite INTEGER
    if isinstance(value, int | float | str | bytes):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str)
    return str(value)


def decode(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """The one decoder of JSON columns: ``row`` with its table's JSON text parsed (in place).
    Text that is not JSON stays as it is."""
    for col in JSON_COLUMNS.get(table, ()):
        if isinstance(row.get(col), str):
            with contextlib.suppress(ValueError):
                row[col] = json.loads(row[col])
    if table == "samples" and row.get("gpu") is not None and "util_pct" in row:
        # a GPU sample's fields by name, as they read before the columns held them
        rest = row.get("metrics")
        fields = {k: row[c] for k, c in SAMPLE_COLUMNS.items() if row.get(c) is not None}
        row["metrics"] = {**fields, **(rest if isinstance(rest, dict) else {})}
    return row


def quote(name: str) -> str:
    return f'"{name}"'
