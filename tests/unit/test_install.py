"""``slurmhealth install`` (the one layout, from the package's own data), the man page
rendered from the click help, and the packaged default config."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import click
from click.testing import CliRunner

from slurmhealth.cli import cli
from slurmhealth.cli.install import LAYOUT, WRAPPERS, install
from slurmhealth.cli.manpage import render
from slurmhealth.cli.options import Ctx
from slurmhealth.config import load_config
from slurmhealth.errors import UsageError
from tests.support.skips import unavailable

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "slurmhealth"


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(install, list(args), obj=Ctx(None, None, False))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_dry_run_lists_the_layout_and_writes_nothing(tmp_path: Path) -> None:
    res = run("--prefix", str(tmp_path / "root"), "--dry-run")
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "root").exists()
    listed = re.findall(r"^would install\s+(\S+)", res.stdout, re.M)
    for wrapper in WRAPPERS:
        assert f"{tmp_path}/root/usr/lib/slurmhealth/{wrapper}" in listed
    assert f"{tmp_path}/root/etc/slurmhealth/config.toml" in listed


def test_install_places_every_file_with_its_mode(tmp_path: Path) -> None:
    res = run("--prefix", str(tmp_path), "--bin", "/opt/sh/bin/slurmhealth")
    assert res.exit_code == 0, res.output
    for wrapper in WRAPPERS:
        placed = tmp_path / "usr/lib/slurmhealth" / wrapper
        assert placed.read_bytes() == (PKG / "wrappers" / wrapper).read_bytes()
        assert mode(placed) == 0o755
    env = (tmp_path / "etc/default/slurmhealth").read_text()
    assert "SLURMHEALTH_BIN=/opt/sh/bin/slurmhealth\n" in env
    assert "@BIN@" not in env
    unit = (tmp_path / LAYOUT["unit"].lstrip("/")).read_text()
    assert f"ExecStart={LAYOUT['bin']} exporter" in unit
    assert mode(tmp_path / "etc/slurmhealth/config.toml") == 0o644
    assert mode(tmp_path / "var/lib/slurmhealth") == 0o755
    assert mode(tmp_path / "var/log/slurmhealth") == 0o750
    assert not (tmp_path / "run").exists()  # tmpfiles.d makes it at boot, not in a root
    client = tmp_path / "usr/lib/slurmhealth/python/slurmhealth"
    assert client.is_symlink() and (client / "job.py").is_file()


def test_install_never_replaces_an_admins_config_but_updates_the_wrappers(
    tmp_path: Path,
) -> None:
    assert run("--prefix", str(tmp_path)).exit_code == 0
    config = tmp_path / "etc/slurmhealth/config.toml"
    config.write_text('[policy]\nmode = "warn"\n')
    prolog = tmp_path / "usr/lib/slurmhealth/slurmhealth-prolog"
    prolog.write_text("old\n")
    again = run("--prefix", str(tmp_path))
    assert again.exit_code == 0
    assert config.read_text() == '[policy]\nmode = "warn"\n'
    assert re.search(rf"^kept \(exists; not replaced\)\s+{config} ", again.stdout, re.M)
    assert prolog.read_text().startswith("#!/bin/sh")


def test_install_json_has_a_schema_and_the_layout(tmp_path: Path) -> None:
    res = run("--prefix", str(tmp_path), "--dry-run", "--json")
    data = json.loads(res.stdout)
    assert data["schema"] == "slurmhealth.install/1" and data["dry_run"] is True
    assert data["layout"]["config"] == f"{tmp_path}/etc/slurmhealth/config.toml"
    assert Path(data["layout"]["scenarios"], "healthy.toml").is_file()
    assert {f["action"] for f in data["files"]} == {"install"}


def test_install_refuses_a_relative_bin_and_an_unwritable_prefix(tmp_path: Path) -> None:
    rel = run("--prefix", str(tmp_path), "--bin", "bin/slurmhealth")
    assert isinstance(rel.exception, UsageError) and rel.exception.exit_code == 2
    assert "not an absolute path" in str(rel.exception)
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = run("--prefix", str(blocker))
    assert isinstance(bad.exception, UsageError) and str(blocker) in str(bad.exception)


def test_man_page_has_every_command_and_is_valid_groff(tmp_path: Path) -> None:
    page = render(cli)
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            escaped = name.replace("-", "\\-")  # groff: a hyphen is written \-
            assert f".SS slurmhealth {escaped}\n" in page
    assert ".SS slurmhealth baseline ingest\n" in page
    assert "\\-\\-json" in page and "Exit codes:" in page
    if shutil.which("groff") is None:
        unavailable("groff is not installed (apt-get install groff-base)")
    out = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=page, text=True,
                         capture_output=True, check=False)  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_installed_man_page_is_gzipped_groff(tmp_path: Path) -> None:
    assert run("--prefix", str(tmp_path)).exit_code == 0
    page = gzip.decompress((tmp_path / LAYOUT["man"].lstrip("/")).read_bytes()).decode()
    assert page.startswith(".TH SLURMHEALTH 1 ")


def test_packaged_config_shows_the_real_defaults() -> None:
    """Every ``# key = value`` of the shipped config, uncommented, is the built-in default
    (the file documents the defaults; it must not drift from config.py)."""
    text = (PKG / "data/config.toml").read_text()
    body = "\n".join(
        line[2:] for line in text.splitlines()
        if re.match(r"# (\[[a-z_.]+\]|[a-z_]+ = )", line)
    )  # fmt: skip
    uncommented = tomllib.loads(body)
    defaults = load_config(os.devnull, env={})
    assert len(uncommented) >= 8
    for section, values in uncommented.items():
        for key, value in values.items():
            assert getattr(getattr(defaults, section), key) == value, f"{section}.{key}"
    as_shipped = load_config(str(PKG / "data/config.toml"), env={})
    assert as_shipped.sources == {}  # all commented: installing it changes nothing


def test_systemd_accepts_the_unit_and_the_tmpfiles_entry(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None or shutil.which("systemd-tmpfiles") is None:
        unavailable("systemd's tools are not installed (apt-get install systemd)")
    assert run("--prefix", str(tmp_path)).exit_code == 0
    unit = tmp_path / LAYOUT["unit"].lstrip("/")
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, check=False)  # fmt: skip
    # what only an installed node has: the venv's executable, the man page
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if "/opt/slurmhealth/bin/slurmhealth is not executable" not in line
                and "man slurmhealth(1)" not in line]  # fmt: skip
    assert problems == []
    tmpfiles = tmp_path / LAYOUT["tmpfiles"].lstrip("/")
    made = subprocess.run(["systemd-tmpfiles", "--create", f"--root={tmp_path}", str(tmpfiles)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert mode(tmp_path / LAYOUT["run"].lstrip("/")) == 0o755


def test_no_note_for_a_bin_that_exists_outside_the_prefix(tmp_path: Path) -> None:
    """scripts/cluster installs under a test prefix with --bin this checkout's venv: it
    exists where the wrappers run it, so `scripts/demo` printed a note that was wrong."""
    venv_bin = tmp_path / "venv" / "slurmhealth"
    venv_bin.parent.mkdir()
    venv_bin.write_text("#!/bin/sh\n")
    res = run("--prefix", str(tmp_path / "root"), "--bin", str(venv_bin))
    assert res.exit_code == 0 and "note:" not in res.output, res.output
    missing = run("--prefix", str(tmp_path / "root2"), "--bin", "/nonexistent/bin/slurmhealth")
    assert "note: /nonexistent/bin/slurmhealth does not exist" in missing.output
