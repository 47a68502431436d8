"""The HTML report's first screen, measured in headless Chromium (Debian's, installed by
scripts/test): at 1400x900 the verdict, whose fault and both next steps are visible without
scrolling, for a 3-node failure and for a 24-hour job.

The report has no script of its own; the test appends one to a copy that writes each
element's box into the DOM, which ``--dump-dom`` prints after the page has laid out."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmhealth.report.build import Report, build_report
from slurmhealth.report.html import to_html
from tests.support.skips import unavailable
from tests.unit.report_jobs import day_job
from tests.unit.test_report import build, make_cluster

SCREEN_W, SCREEN_H = 1400, 900
FIRST_SCREEN = ("verdict", "fault", "user-action", "admin-action")
MEASURE = """<script>
const boxes = {};
for (const id of %s) {
  const e = document.getElementById(id);
  if (e) { const r = e.getBoundingClientRect(); boxes[id] = [r.top, r.bottom, r.width]; }
}
document.body.setAttribute("data-boxes", JSON.stringify(boxes));
</script>"""


@pytest.fixture
def failed_job(tmp_path: Path) -> Path:
    """test_report's 3-node job 42: GPU 5 on n2 fell off the bus, n2 drained."""
    return make_cluster(tmp_path)


def boxes(report: Report, tmp: Path) -> dict[str, list[float]]:
    """Each first-screen element's [top, bottom, width] in CSS pixels at 1400x900."""
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("Debian's chromium is not installed")
    page = tmp / "measured.html"
    script = MEASURE % json.dumps(list(FIRST_SCREEN))
    page.write_text(to_html(report).replace("</body>", script + "</body>"))
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp / 'chrome'}", f"--window-size={SCREEN_W},{SCREEN_H}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    found = re.search(r'data-boxes="([^"]*)"', dom)
    assert found, dom[:500]
    return dict(json.loads(html.unescape(found.group(1))))


def assert_first_screen(found: dict[str, list[float]]) -> None:
    assert set(found) == set(FIRST_SCREEN), found
    for name, (top, bottom, width) in found.items():
        assert 0 <= top < bottom <= SCREEN_H and width > 0, (name, top, bottom)


def test_three_node_failure_answers_on_the_first_screen(failed_job: Path, tmp_path: Path) -> None:
    found = boxes(build(failed_job), tmp_path)
    assert_first_screen(found)
    assert found["verdict"][1] <= found["fault"][0] <= found["user-action"][0]


def test_day_long_job_answers_on_the_first_screen(tmp_path: Path) -> None:
    report = build_report(day_job(tmp_path / "job"), "77")
    assert len(report.timeline) > 70  # long enough that a timeline first would push it down
    assert_first_screen(boxes(report, tmp_path))
