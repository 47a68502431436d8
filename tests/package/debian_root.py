"""Helpers of the package tests: clean Debian roots (debootstrap once per release and package
list, then a cached tarball), commands in them (chroot), the project's .deb.

A root is made by ``debootstrap --variant=minbase`` from Debian's archive, then the extra
packages are installed in it by apt-get (no service starts: policy-rc.d says no), apt's
caches are emptied and the tree is packed into ``$SLURMHEALTH_TEST_CACHE`` (default
/var/cache/slurmhealth-test) under a name that hashes everything that made it. A later run
unpacks it (seconds instead of minutes); a tarball older than ``CACHE_MAX_AGE_S`` is made
again so that the roots follow Debian's point releases."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MIRROR = os.environ.get("SLURMHEALTH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("SLURMHEALTH_TEST_CACHE", "/var/cache/slurmhealth-test"))
CACHE_MAX_AGE_S = 14 * 86400
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


def sh(
    *argv: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, cwd=cwd, env=env, timeout=timeout
    )


def need_tools(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (apt-get install debootstrap zstd)")


def host_codename() -> str:
    m = re.search(r"^VERSION_CODENAME=(\w+)", Path("/etc/os-release").read_text(), re.M)
    assert m, "/etc/os-release names no VERSION_CODENAME"
    return m.group(1)


def chroot(root: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``sh -euc SCRIPT`` in ``root`` with a clean environment plus ``env``."""
    pairs = (f"{k}={v}" for k, v in {**BASE_ENV, **env}.items())
    return sh("chroot", str(root), "env", "-i", *pairs, "sh", "-euc", script)


def build_deb(outdir: Path, revision: int) -> Path:
    """The package built from this checkout on this machine (its python3)."""
    done = sh(str(REPO / "scripts/build-deb"), "--revision", str(revision), "--outdir", str(outdir))
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def debian_root(codename: str, where: Path, include: str = "", packages: str = "") -> float:
    """A clean Debian ``codename`` root at ``where`` (which must not exist), with debootstrap's
    ``--include`` list and then ``packages`` (apt-get, space-separated) installed. Returns
    the seconds it took; from the cache when a fresh enough tarball of the same recipe is
    there."""
    t0 = time.monotonic()
    recipe = f"v1 {codename} {MIRROR} include={include} packages={packages}"
    tarball = CACHE / f"{codename}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.tar.zst"
    if tarball.exists() and time.time() - tarball.stat().st_mtime < CACHE_MAX_AGE_S:
        where.mkdir(parents=True)
        done = sh("tar", "--zstd", "-xpf", str(tarball), "--numeric-owner", "-C", str(where))
        assert done.returncode == 0, f"unpacking {tarball}: {done.stderr[-2000:]}"
        return time.monotonic() - t0
    need_tools("debootstrap", "zstd")
    argv = ["debootstrap", "--variant=minbase", *([f"--include={include}"] if include else [])]
    made = sh(*argv, codename, str(where), MIRROR)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    _apt_install(where, packages)
    CACHE.mkdir(parents=True, exist_ok=True)
    part = tarball.with_name(f"{tarball.name}.{os.getpid()}.part")
    packed = sh("tar", "-I", "zstd -T0 -3", "-cpf", str(part), "--numeric-owner", "-C",
                str(where), ".")  # fmt: skip
    assert packed.returncode == 0, f"packing {part}: {packed.stderr[-2000:]}"
    part.rename(tarball)
    for old in CACHE.glob(f"{codename}-*.tar.zst"):
        if old != tarball:  # another recipe's: a root is some hundreds of MB
            old.unlink(missing_ok=True)
    return time.monotonic() - t0


def remove_root(root: Path) -> None:
    """Delete a root (some hundreds of MB) once nothing is mounted below it."""
    mounts = Path("/proc/self/mountinfo").read_text()
    assert f" {root}/" not in mounts, f"still mounted below {root}: not removed"
    shutil.rmtree(root, ignore_errors=True)


def _apt_install(root: Path, packages: str) -> None:
    """apt-get install PACKAGES in ``root`` (no service starts), then empty apt's caches;
    /proc is mounted in a private mount namespace, gone when the command ends."""
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\n# no daemon starts while packages are installed\nexit 101\n")
    policy.chmod(0o755)
    script = "apt-get clean && rm -rf /var/lib/apt/lists/*"
    if packages:
        script = (
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
            f"--no-install-recommends {packages} >/dev/null && {script}"
        )
    argv = ["chroot", str(root), "env", "-i", *(f"{k}={v}" for k, v in BASE_ENV.items())]
    done = sh("unshare", "--mount", "--propagation", "private", "sh", "-euc",
              'mount -t proc proc "$0/proc"; exec "$@"', str(root), *argv, "sh", "-euc",
              script)  # fmt: skip
    assert done.returncode == 0, f"apt-get install {packages}: {done.stderr[-3000:]}"
