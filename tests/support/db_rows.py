"""Rows of a history table as a user's query would read them (tests only)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def table_rows(db: Path, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` in ``db``, in insertion order."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]
    finally:
        conn.close()
