"""The Debian package in a clean Debian root (debootstrap, chroot): the README's node commands
run literally, the prolog wrapper on the simulator, an upgrade that keeps an edited
conffile, a downgrade below a newer history (refused in one line, the prolog fails open),
removal that keeps the config and purge that removes it. And the wheel path of
the README with ``--prefix`` into a temp dir. Root only; minutes (debootstrap about 2 min
here, seconds once its tarball is cached: debian_root.py; each package build under 1 min):
marked slow, CI runs it (scripts/test)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmhealth.hooks.snapshot_cache import MAX_AGE_S
from tests.package.debian_root import (
    REPO,
    build_deb,
    chroot,
    debian_root,
    host_codename,
    remove_root,
    sh,
)
from tests.support.skips import root_only

SCENARIOS = "/opt/slurmhealth/lib/python{v}/site-packages/slurmhealth/scenarios"
PY = "/opt/slurmhealth/bin/python"
DB = "/var/lib/slurmhealth/history/history.db"

pytestmark = [
    pytest.mark.slow,
    root_only("debootstrap and chroot need root"),
]


def readme_block(tag: str) -> list[str]:
    """The command lines of the README's ```sh block after ``<!-- test: TAG -->``."""
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- test: {tag} -->\s*```sh\n(.*?)```", text, re.S)
    assert m, f"README has no block tagged {tag}"
    lines = [ln.split("  #")[0].strip() for ln in m.group(1).splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh minimal Debian root of the host's release (the venv links to its python3)."""
    where = tmp_path_factory.mktemp("debian") / "root"
    debian_root(host_codename(), where, include="python3")
    sh("mount", "-t", "proc", "proc", str(where / "proc"))
    try:
        yield where
    finally:
        sh("umount", "-l", str(where / "proc"))
        remove_root(where)


def prolog(root: Path, scenario: str, job: str) -> subprocess.CompletedProcess[str]:
    pyver = chroot(root, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'")
    scenarios = SCENARIOS.format(v=pyver.stdout.strip())
    return chroot(root, "/usr/lib/slurmhealth/slurmhealth-prolog", SLURM_JOB_ID=job,
                  SLURMD_NODENAME="n1", SLURM_JOB_GPUS="0,1,2,3",
                  SLURMHEALTH_GPU_BACKEND="sim",
                  SLURMHEALTH_SIM_SCENARIO=f"{scenarios}/{scenario}.toml")  # fmt: skip


def status(root: Path) -> str:
    return chroot(root, "dpkg-query -W -f='${Status} ${Version}' slurmhealth || :").stdout


def test_deb_installs_upgrades_and_removes_in_a_clean_debian_root(
    root: Path, tmp_path: Path
) -> None:
    debs = [build_deb(tmp_path, 1), build_deb(tmp_path, 2)]
    for deb in debs:
        shutil.copy(deb, root / "root")
    # install: the README's commands on a node, literally (the v1 package alone in /root)
    (root / "root" / debs[1].name).rename(root / debs[1].name)
    done = chroot(root, "cd /root && " + " && ".join(readme_block("deb")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "config OK" in done.stdout
    assert status(root) == "install ok installed 0.1.0-1"
    for wrapper in ("prolog", "epilog", "healthcheck"):
        assert os.access(root / f"usr/lib/slurmhealth/slurmhealth-{wrapper}", os.X_OK)
    assert (root / "usr/share/man/man1/slurmhealth.1.gz").stat().st_size > 1000
    conffiles = chroot(root, "cat /var/lib/dpkg/info/slurmhealth.conffiles").stdout.split()
    assert "/etc/slurmhealth/config.toml" in conffiles

    # the prolog wrapper on the simulator: healthy runs, an NVLink down fails the launch
    config = root / "etc/slurmhealth/config.toml"
    config.write_text(config.read_text() + "\n[sidecar]\nenabled = false\n")
    assert prolog(root, "healthy", "41").returncode == 0
    time.sleep(MAX_AGE_S + 0.2)  # a prolog this soon after would share the healthy read
    bad = prolog(root, "nvlink-down", "42")
    assert bad.returncode == 1, bad.stderr
    log = (root / "var/log/slurmhealth/slurmhealth.log").read_text()
    assert re.search(r"^\S+Z slurmhealth-prolog\[job=42 node=n1\]: .*nvlink_inactive gpu3", log,
                     re.M)  # fmt: skip

    # upgrade: the new version runs, the admin's edit of the conffile stays
    (root / debs[1].name).rename(root / "root" / debs[1].name)
    up = chroot(root, f"dpkg -i /root/{debs[1].name}")
    assert up.returncode == 0, up.stdout + up.stderr
    assert status(root) == "install ok installed 0.1.0-2"
    assert "enabled = false" in config.read_text()
    assert not (root / "etc/slurmhealth/config.toml.dpkg-dist").exists()
    client = chroot(root, "PYTHONPATH=/usr/lib/slurmhealth/python python3 -c "
                    "'import slurmhealth.job, click' 2>&1 || :")  # fmt: skip
    assert "No module named 'click'" in client.stdout  # the client alone, not the venv's deps
    history = chroot(root, "slurmhealth history --node n1 --json")
    assert history.returncode == 0 and '"job_id": "42"' in history.stdout

    # downgrade below a newer history (as if 0.1.0-2 had migrated it): the package goes
    # back, the older release refuses the history in one line and the prolog fails open
    bump = chroot(
        root,
        f"{PY} -c \"import sqlite3; c = sqlite3.connect('{DB}'); "
        "v = c.execute('pragma user_version').fetchone()[0]; "
        "c.execute(f'pragma user_version = {v + 1}'); c.commit(); print(v)\"",
    )
    known = int(bump.stdout)
    down = chroot(root, f"dpkg -i /root/{debs[0].name}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert status(root) == "install ok installed 0.1.0-1"
    refused = chroot(root, "slurmhealth history --node n1")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert f"schema version {known + 1}, newer" in refused.stderr
    time.sleep(MAX_AGE_S + 0.2)
    opened = prolog(root, "nvlink-down", "43")
    assert opened.returncode == 0 and "failing open" in opened.stderr, opened.stderr

    # remove keeps the config; purge removes it (the history stays, see postrm)
    assert chroot(root, "dpkg -r slurmhealth").returncode == 0
    assert config.exists() and (root / "etc/default/slurmhealth").exists()
    assert not (root / "opt/slurmhealth").exists()
    assert not (root / "usr/lib/slurmhealth").exists()
    assert status(root).startswith("deinstall ok config-files")
    assert chroot(root, "dpkg -P slurmhealth").returncode == 0
    assert not (root / "etc/slurmhealth").exists()
    assert not (root / "etc/default/slurmhealth").exists()
    assert (root / "var/lib/slurmhealth/history/history.db").exists()


def test_readme_wheel_path_with_a_prefix(tmp_path: Path) -> None:
    """The README's install without a package, every /opt/slurmhealth under ``tmp_path``
    and ``install --prefix``: the venv, the wheel, the layout, a config check."""
    wheel = sh(str(REPO / ".venv/bin/python"), "-m", "build", "--wheel", "--outdir",
               str(tmp_path / "dist"), str(REPO))  # fmt: skip
    assert wheel.returncode == 0, wheel.stderr
    prefix = str(tmp_path / "node")
    venv = f"{prefix}/opt/slurmhealth"
    for line in readme_block("wheel"):
        line = line.replace("/opt/slurmhealth", venv).replace("python3 ", "/usr/bin/python3 ")
        line = line.replace("slurmhealth install", f"slurmhealth install --prefix {prefix} "
                            f"--bin {venv}/bin/slurmhealth")  # fmt: skip
        env = {**os.environ, "SLURMHEALTH_CONFIG": f"{prefix}/etc/slurmhealth/config.toml"}
        done = sh("sh", "-euc", line, cwd=tmp_path, env=env)
        assert done.returncode == 0, f"{line}: {done.stdout}{done.stderr}"
    env_file = Path(prefix, "etc/default/slurmhealth")
    assert f"SLURMHEALTH_BIN={venv}/bin/slurmhealth" in env_file.read_text()
    # the wrapper reads the env file: its system paths moved under the prefix for this run
    env_file.write_text(env_file.read_text().replace("=/etc/", f"={prefix}/etc/")
                        .replace("=/var/log/", f"={prefix}/var/log/"))  # fmt: skip
    config = Path(prefix, "etc/slurmhealth/config.toml")
    config.write_text(config.read_text() + f'[paths]\ndb = "{tmp_path}/history.db"\n'
                      f'run_dir = "{tmp_path}/run"\n[sidecar]\nenabled = false\n')  # fmt: skip
    ok = sh(f"{prefix}/usr/lib/slurmhealth/slurmhealth-prolog", env={
        "PATH": "/usr/bin:/bin", "SLURMHEALTH_ENV_FILE": str(env_file),
        "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURMHEALTH_GPU_BACKEND": "sim",
        "SLURMHEALTH_SIM_SCENARIO": str(REPO / "scenarios/healthy.toml"),
        "SLURMHEALTH_SIM_KERNEL_LOG": str(tmp_path / "kmsg"),
    })  # fmt: skip
    assert ok.returncode == 0 and "failing open" not in ok.stderr, ok.stderr
    log = Path(prefix, "var/log/slurmhealth/slurmhealth.log").read_text()
    assert "slurmhealth prolog[job=7 node=n1]: INFO: ok" in log
