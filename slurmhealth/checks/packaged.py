"""The checks' packaged tables (``xid_catalog.toml``, ``sku_table.toml``, ...), read from
the package's own folder. ``importlib.resources`` would do the same for an installed
package at the cost of ~5 ms of imports (pathlib, tempfile, zipfile readers) in every
prolog that runs the SKU check; slurmhealth is never imported from a zip."""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def packaged_text(name: str) -> str:
    """The text of data file ``name`` shipped beside this module (root's install)."""
    with open(os.path.join(HERE, name), encoding="utf-8") as fh:
        return fh.read()
