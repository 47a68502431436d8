"""The docs, templates and deploy files agree with each other and with the code: one install
layout, links that stay inside the repository, the exporter's port, the outlier fraction
and what a healthy ``check`` prints."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmhealth.cli.install import LAYOUT, WRAPPERS
from slurmhealth.config import load_config

REPO = Path(__file__).resolve().parents[2]
TEXT_DIRS = ("docs", "deploy", "sbatch-templates", "tests", "benchmarks", "slurmhealth", "scripts")
# the layouts the docs used to disagree on (issue 15): a .venv inside /opt/slurmhealth, a
# src/ checkout, wrappers in per-hook folders there
OLD_PATHS = re.compile(r"/opt/slurmhealth/(\.venv|src\b|prolog/|epilog/|healthcheck/)")
DEFAULTS = load_config("/dev/null", env={})


def _text_files() -> list[Path]:
    files = [REPO / "README.md"]
    for top in TEXT_DIRS:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
                files.append(path)
    return files


def test_no_file_names_an_old_install_layout() -> None:
    here = Path(__file__).resolve()
    found = []
    for path in _text_files():
        if path == here:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in OLD_PATHS.finditer(text)]
    assert found == []


def test_slurm_conf_snippet_names_the_installed_wrappers() -> None:
    snippet = (REPO / "deploy/slurm/slurm.conf.snippet").read_text()
    keys = r"^#?(Prolog|Epilog|HealthCheckProgram|EpilogSlurmctld)=(\S+)"  # (the last optional)
    named = dict(re.findall(keys, snippet, re.M))
    assert named == {
        "Prolog": f"{LAYOUT['wrappers']}/slurmhealth-prolog",
        "Epilog": f"{LAYOUT['wrappers']}/slurmhealth-epilog",
        "HealthCheckProgram": f"{LAYOUT['wrappers']}/slurmhealth-healthcheck",
        "EpilogSlurmctld": f"{LAYOUT['wrappers']}/slurmhealth-ctld-epilog",
    }
    assert {Path(p).name for p in named.values()} == set(WRAPPERS)
    # what the hooks rely on: the prolog at allocation, a failed prolog's job requeued (not
    # held), a bound on every prolog/epilog above the wrappers' own budgets
    settings = dict(re.findall(r"^(PrologFlags|SchedulerParameters|PrologEpilogTimeout)=(\S+)",
                               snippet, re.M))  # fmt: skip
    assert settings == {"PrologFlags": "Alloc", "SchedulerParameters": "nohold_on_prolog_fail",
                        "PrologEpilogTimeout": "30"}  # fmt: skip


@pytest.mark.parametrize("doc", ["README.md", "deploy/slurm/README.md"])
def test_docs_show_the_layout_paths(doc: str) -> None:
    text = (REPO / doc).read_text()
    for key in ("bin", "config"):
        assert LAYOUT[key] in text, key
    assert f"{LAYOUT['wrappers']}/slurmhealth-" in text


def test_markdown_links_stay_inside_the_repository() -> None:
    bad = []
    for md in [p for p in _text_files() if p.suffix == ".md"]:
        for target in re.findall(r"\]\(([^)\s#]+)[^)]*\)", md.read_text()):
            if re.match(r"[a-z]+:", target):  # a URL, not a file
                continue
            resolved = (md.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                bad.append(f"{md.relative_to(REPO)}: {target}")
    assert bad == []


def test_prometheus_example_scrapes_the_exporters_port() -> None:
    yml = (REPO / "deploy/prometheus/prometheus.yml").read_text()
    job = yml.split("job_name: slurmhealth", 1)[1].split("job_name:", 1)[0]
    ports = set(re.findall(r'"[\w.-]+:(\d+)"', job))
    assert ports == {str(DEFAULTS.metrics.port)}


def test_readme_outlier_fraction_is_the_default() -> None:
    text = " ".join((REPO / "README.md").read_text().split())
    m = re.search(r"`outliers` finds the node or the GPU below (\d+)% of its peers", text)
    assert m, "README no longer describes `baseline outliers`"
    assert int(m.group(1)) / 100 == DEFAULTS.baseline.outlier_fraction


def test_a_healthy_check_prints_the_line_deploy_describes(
    sim_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    import subprocess
    import sys

    doc = " ".join((REPO / "deploy/slurm/README.md").read_text().split())
    assert "`NODE check at TIME: OK on 8 GPUs, all passed (N ms)`" in doc
    run = subprocess.run([sys.executable, "-m", "slurmhealth", "check"], env=sim_env(),
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"node1 check at \S+Z: OK on 8 GPUs, all passed \(\d+ ms\)\n",
                        run.stdout), run.stdout  # fmt: skip
    # the first run's kernel-log note: once, on stderr, not again under the answer
    assert run.stderr.count("kernel-log position rebuilt") == 1, run.stderr
    assert "FAIL on GPU 3 (NVLink 7 inactive); 7 other GPUs passed" in doc
