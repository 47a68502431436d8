"""Past scrapes into a real Prometheus: each scrape is what the node's exporter serves for a
job's sidecar state (the real ``SidecarCollector``), stamped with its time, written as
OpenMetrics text and backfilled with ``promtool tsdb create-blocks-from openmetrics`` into
the data dir Prometheus then starts on (``tests.prometheus_util.start_prometheus``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from slurmhealth.metrics.export_state import merged
from slurmhealth.metrics.job_series import SidecarCollector, render
from slurmhealth.model_records import ExportState
from tests.prometheus_util import promtool

# one block per backfill pass: promtool reads the whole file once per block it writes, and
# 2 h blocks would read a week-long file 84 times (the largest block promtool makes: 486 h)
MAX_BLOCK = "500h"


def scrape(state: ExportState, job_labels: str = "series") -> str:
    """The exposition text one scrape of ``state`` returns (``[metrics] job_labels``)."""
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: state, job_labels=job_labels))
    return render(registry).decode()


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def scrape_families(families: list[dict[str, Any]]) -> str:
    """The exposition text the exporter serves for ``families`` in the state file's form
    (e.g. a finished job's ``final_series``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(merged([families])))  # type: ignore[arg-type]
    return render(registry).decode()


def stamped(text: str, ts: float) -> str:
    """The sample lines of an exposition ``text`` with the scrape's time (OpenMetrics:
    seconds); HELP/TYPE lines dropped (the series are stored untyped, values unchanged)."""
    stamp = f" {ts:.3f}\n"
    return "".join(line + stamp for line in text.splitlines() if line and line[0] != "#")


def write_openmetrics(path: Path, scrapes: Iterable[str]) -> Path:
    """Stamped scrapes, in time order, as one OpenMetrics file (ending in ``# EOF``)."""
    with path.open("w") as out:
        for chunk in scrapes:
            out.write(chunk)
        out.write("# EOF\n")
    return path


def backfill(openmetrics: Path, data_dir: Path) -> str:
    """Blocks of ``openmetrics`` in ``data_dir`` (created); returns promtool's report."""
    data_dir.mkdir(parents=True, exist_ok=True)
    done = promtool(
        "tsdb", "create-blocks-from", "openmetrics", f"--max-block-duration={MAX_BLOCK}",
        str(openmetrics), str(data_dir), timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stderr.strip()[-2000:]}")
    return done.stdout
