"""A two-node Slurm cluster inside a Debian root, isolated from the host: its own PID, mount,
network (loopback only), UTS (host name ``n1``) and IPC namespaces, its own /dev (the null
devices plus eight fake GPUs, ``/dev/nvidia[0-7]``, as gres.conf wants character devices),
its own munge key and socket; where the root has a slurmdbd.conf, its own MariaDB (socket
only) and slurmdbd, with the cluster registered. Nothing it mounts is seen outside; when the
namespace's first process dies the kernel ends every process in it, daemons included:
stopping is one kill.

Commands run in it with ``nsenter`` (as root, in the root's /)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.package.debian_root import BASE_ENV, sh

# runs as PID 1 of the new namespaces, before the chroot: mounts, devices, loopback, name
SETUP = r"""
R=$0
mount -t proc proc "$R/proc"
mount -t sysfs -o ro sysfs "$R/sys"
mount -t tmpfs -o mode=0755,size=8m dev "$R/dev"
cd "$R/dev"
mknod -m 666 null c 1 3; mknod -m 666 zero c 1 5; mknod -m 666 full c 1 7
mknod -m 666 random c 1 8; mknod -m 666 urandom c 1 9; mknod -m 666 tty c 5 0
ln -s /proc/self/fd fd; ln -s fd/0 stdin; ln -s fd/1 stdout; ln -s fd/2 stderr
mkdir shm; mount -t tmpfs -o mode=1777,size=64m shm shm
for i in 0 1 2 3 4 5 6 7; do mknod -m 666 "nvidia$i" c 1 3; done
cd /
ip link set lo up
# an address besides 127.0.0.1, on lo too: glibc's AI_ADDRCONFIG (Slurm's getaddrinfo for its
# listening sockets) counts only such, and without one slurmd cannot bind
ip addr add 127.0.0.2/8 dev lo
hostname n1
exec chroot "$R" /usr/bin/python3 -c "$REAPER"
"""
# PID 1 in the root: says it is up, then reaps the orphans (daemons, their children)
REAPER = """
import os, time
open("/run/slurm-node-ready", "w").close()
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""

START_DAEMONS = """
# wait_for SECONDS WHAT CMD...: until CMD succeeds, else fail naming WHAT
wait_for() {
    tries=$(($1 * 10)); what=$2; shift 2; i=0
    until "$@" >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt $tries ] || { echo "$what does not answer" >&2; exit 1; }
        sleep 0.1
    done
}
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge /etc/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
fi
runuser -u munge -- /usr/sbin/munged
wait_for 10 munged sh -c 'munge -n | unmunge'
install -d /var/lib/slurm/slurmctld /var/lib/slurm/slurmd/n1 /var/lib/slurm/slurmd/n2 \
    /var/log/slurm
if [ -f /etc/slurm/slurmdbd.conf ]; then  # accounting: MariaDB (socket only), slurmdbd
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    if [ ! -d /var/lib/mysql/mysql ]; then
        install -d -o mysql -g mysql -m 0700 /var/lib/mysql
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql \
            --auth-root-authentication-method=socket >/var/log/mariadb-install.log 2>&1
    fi
    setsid mariadbd --user=mysql --datadir=/var/lib/mysql --skip-networking \
        --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mariadbd.pid \
        --log-error=/var/log/mariadb.log </dev/null >/dev/null 2>&1 &
    wait_for 30 MariaDB mariadb -u root -e 'SELECT 1'
    mariadb -u root -e 'CREATE DATABASE IF NOT EXISTS slurm_acct_db'
    slurmdbd
    wait_for 30 slurmdbd sacctmgr -n -P show cluster format=cluster
    sacctmgr -n -P show cluster format=cluster | grep -qx trixie ||
        sacctmgr -i add cluster trixie >/dev/null
fi
slurmctld
slurmd -N n1
slurmd -N n2
"""


class SlurmNode:
    """The namespaces around ``root``; ``run`` executes a shell script inside."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "run/slurm-node-ready").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            ["unshare", "--fork", "--pid", "--mount", "--net", "--uts", "--ipc",
             "--propagation", "private", "--kill-child=SIGKILL",
             "env", f"REAPER={REAPER}", "sh", "-euc", SETUP, str(root)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (root / "run/slurm-node-ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.proc.communicate(timeout=10)[0] if self.proc.poll() is not None else ""
                self.stop()
                raise RuntimeError(f"the namespace did not come up: {out[-2000:]}")
            time.sleep(0.1)
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        self.init_pid = int(children.split()[0])  # PID 1 inside, as the host numbers it

    def run(self, script: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        pairs = (f"{k}={v}" for k, v in {**BASE_ENV, **env}.items())
        return sh("nsenter", "-t", str(self.init_pid), "-m", "-n", "-u", "-i", "-p", "-r", "-w",
                  "env", "-i", *pairs, "sh", "-euc", script, timeout=timeout)  # fmt: skip

    def start_slurm(self, timeout: float = 90) -> None:
        done = self.run(START_DAEMONS)
        assert done.returncode == 0, done.stdout + done.stderr + self.logs()
        deadline = time.monotonic() + timeout
        while self.states() != {"n1": "idle", "n2": "idle"}:
            assert time.monotonic() < deadline, f"nodes {self.states()}\n{self.logs()}"
            time.sleep(0.5)

    def states(self) -> dict[str, str]:
        out = self.run("sinfo -h -N -o '%N %T'").stdout.split()
        return dict(zip(out[::2], out[1::2], strict=False))

    def logs(self) -> str:
        """The tail of every daemon's and slurmhealth's log, for a failure's message."""
        text = []
        for log in ("slurm/slurmctld.log", "slurm/slurmd.n1.log", "slurm/slurmd.n2.log",
                    "slurm/slurmdbd.log", "mariadb.log", "munge/munged.log",
                    "slurmhealth/slurmhealth.log"):  # fmt: skip
            path = self.root / "var/log" / log
            if path.exists():
                text.append(f"--- {log}\n" + "\n".join(path.read_text().splitlines()[-25:]))
        return "\n".join(text)

    def stop(self) -> None:
        """One kill: unshare's child (the namespace's PID 1) follows it, and with it every
        process inside; the mount namespace and its mounts go with the last of them."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        if self.proc.stdout:
            self.proc.stdout.close()
        init = getattr(self, "init_pid", None)
        deadline = time.monotonic() + 30
        while init and Path(f"/proc/{init}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
