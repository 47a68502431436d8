"""The HTML report's first screen, measured in headless Chromium (Debian's, installed by
scripts/test): at 1280x800 (a laptop) the verdict, whose fault, the user's next step, what
slurmhealth already did and what is left for the admins are visible without scrolling, for a
3-node failure, a node slurmhealth drained and a 24-hour job. ``SLURMHEALTH_SCREENSHOTS=DIR``
keeps a PNG of each first screen there, to look at.

The report has no script of its own; the test appends one to a copy that writes each
element's box into the DOM, which ``--dump-dom`` prints after the page has laid out."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmhealth.report.build import Report
from slurmhealth.report.gather import build_report
from slurmhealth.report.html import to_html
from tests.support.skips import unavailable
from tests.unit.report_jobs import day_job
from tests.unit.test_report import build, make_cluster
from tests.unit.test_report_next_step import nvlink_job

SCREEN_W, SCREEN_H = 1280, 800
FIRST_SCREEN = ("verdict", "fault", "user-action", "admin-action")
DONE = "admin-done"  # on the first screen too where something was done
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


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("Debian's chromium is not installed")
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", f"--user-data-dir={tmp / 'chrome'}",
         f"--window-size={SCREEN_W},{SCREEN_H}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def boxes(report: Report, tmp: Path, name: str = "") -> dict[str, list[float]]:
    """Each first-screen element's [top, bottom, width] in CSS pixels at 1280x800; with
    SLURMHEALTH_SCREENSHOTS set, that screen as ``<dir>/<name>.png`` too."""
    page = tmp / "measured.html"
    script = MEASURE % json.dumps([*FIRST_SCREEN, DONE])
    page.write_text(to_html(report).replace("</body>", script + "</body>"))
    dom = _chromium(tmp, "--dump-dom", page.as_uri()).stdout
    found = re.search(r'data-boxes="([^"]*)"', dom)
    assert found, dom[:500]
    keep = os.environ.get("SLURMHEALTH_SCREENSHOTS")
    if keep and name:
        shot = Path(keep) / f"{name}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        (tmp / "shown.html").write_text(to_html(report))
        _chromium(tmp, f"--screenshot={shot}", (tmp / "shown.html").as_uri())
        assert shot.stat().st_size > 0
    return dict(json.loads(html.unescape(found.group(1))))


def assert_first_screen(found: dict[str, list[float]], done: bool = True) -> None:
    assert set(found) == {*FIRST_SCREEN, *([DONE] if done else [])}, found
    for name, (top, bottom, width) in found.items():
        assert 0 <= top < bottom <= SCREEN_H and width > 0, (name, top, bottom)


def test_three_node_failure_answers_on_the_first_screen(failed_job: Path, tmp_path: Path) -> None:
    found = boxes(build(failed_job), tmp_path, "three-node-xid79")
    assert_first_screen(found)
    assert found["verdict"][1] <= found["fault"][0] <= found["user-action"][0]
    assert found["user-action"][1] <= found[DONE][0] <= found["admin-action"][0]


def test_node_slurmhealth_drained_answers_on_the_first_screen(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    report = build(nvlink_job(tmp_path / "job"), "50")
    assert report.answer is not None and "already drained" in report.answer.admin_action
    assert_first_screen(boxes(report, tmp_path, "prolog-drained-nvlink"))


def test_day_long_job_answers_on_the_first_screen(tmp_path: Path) -> None:
    report = build_report(day_job(tmp_path / "job"), "77")
    assert len(report.timeline) > 70  # long enough that a timeline first would push it down
    assert_first_screen(boxes(report, tmp_path, "day-long-throttle"), done=False)
