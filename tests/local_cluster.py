"""A cluster on this machine, as the cluster test needs it: a one-node SLURM cluster (munge,
slurmctld, slurmd, and slurmdbd over MariaDB so that sacct answers), a Ray head, and an MLflow
server over PostgreSQL, each on 127.0.0.1 or a Unix socket, all in one temporary folder.

`LocalCluster` is a context manager: whichever way its block ends, every job is cancelled, every
daemon stopped (its whole process session), the temporary folder removed, and the one file it
writes outside it (/etc/slurm/slurm.conf, where `srun` inside a job looks: Snakemake's job step
drops SLURM_CONF) taken away again. `why_unavailable()` says why it cannot start here.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

# The commands the cluster runs, and the Debian package each comes from.
DEBIAN_PACKAGES = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sbatch": "slurm-client",
    "slurmdbd": "slurmdbd",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
}
POSTGRES_PACKAGE = "postgresql"
SYSTEM_SLURM_CONF = Path("/etc/slurm/slurm.conf")
CLUSTER_NAME = "vlbert-test"
PARTITION = "debug"


def _postgres_bin() -> Path | None:
    """Debian's PostgreSQL server programs (initdb, postgres): /usr/lib/postgresql/<version>/bin."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def _command(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(Path(d) / name) for d in ("/usr/sbin", "/sbin") if (Path(d) / name).exists()), None
    )


def why_unavailable() -> str | None:
    """Why the cluster cannot start on this machine (None when it can)."""
    if os.geteuid() != 0:
        return "slurmd starts jobs as their users and PostgreSQL runs as its own: run as root"
    missing = sorted({package for name, package in DEBIAN_PACKAGES.items() if not _command(name)})
    if _postgres_bin() is None:
        missing.append(POSTGRES_PACKAGE)
    if missing:
        return f"Debian packages missing: apt-get install {' '.join(missing)} (`make cluster-deps`)"
    if SYSTEM_SLURM_CONF.exists():
        return f"{SYSTEM_SLURM_CONF} exists: this machine has a SLURM of its own, which the test leaves alone"
    try:
        import psycopg2  # noqa: F401  (mlflow's PostgreSQL driver)
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed: pip install -e '.[cluster]'"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, process: subprocess.Popen | None = None, timeout: float = 120, log: Path | None = None):
    """Poll `check()` until it is true; fail with `what` (and the log's tail) on timeout or exit."""
    deadline = time.time() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        ended = process is not None and process.poll() is not None
        if ended or time.time() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} did not come up ({'it exited' if ended else 'timed out'}):\n{tail}")
        time.sleep(0.5)


def _quiet(*command, env=None, user: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    command = ["runuser", "-u", user, "--", *command] if user else list(command)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, **kwargs)


class LocalCluster:
    """The services of the cluster test; use as `with LocalCluster() as cluster:`."""

    def __init__(self, cpus: int | None = None, memory_mb: int | None = None):
        import psutil

        self.cpus = cpus or os.cpu_count() or 1
        # slurmd drains a node that declares more memory than it has.
        self.memory_mb = memory_mb or int(psutil.virtual_memory().total / 2**20 * 0.8)
        self.node = socket.gethostname().split(".")[0]
        self.ports = {}
        self._daemons: list[tuple[str, subprocess.Popen, signal.Signals]] = []
        self._stack = ExitStack()

    # --- the whole cluster ------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        why = why_unavailable()
        if why:
            raise RuntimeError(why)
        # Short: Ray's and munge's socket paths must stay within 107 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix="vlbert-cluster-", dir="/tmp"))
        os.chmod(self.folder, 0o755)  # PostgreSQL's own user enters it
        self._stack.callback(shutil.rmtree, self.folder, ignore_errors=True)
        self._stack.callback(self._stop_daemons)
        try:
            self._start_munge()
            self._start_mariadb()
            self._start_slurm()
            self._start_postgres()
            self._start_mlflow()
            self._start_ray()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    @property
    def env(self) -> dict:
        """The environment of a client of this cluster: Snakemake, sbatch, the sweeps' Ray."""
        return {**os.environ, **self._ray_env}

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['mlflow']}"

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.ports['ray']}"

    def log(self, name: str) -> Path:
        return self.folder / "logs" / name

    # --- daemons ------------------------------------------------------------------------------

    def _daemon(self, name: str, command: list, stop=signal.SIGTERM, env=None, user: str | None = None):
        """Start a daemon in the foreground, in a session of its own (which teardown ends)."""
        (self.folder / "logs").mkdir(exist_ok=True)
        log = self.log(f"{name}.log").open("ab")
        if user:
            command = ["runuser", "-u", user, "--", *command]
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env or os.environ, start_new_session=True
        )
        self._daemons.append((name, process, stop))
        return process

    def _stop_daemons(self):
        """Cancel every job, then stop the daemons newest first, each with its whole session."""
        import psutil

        if any(name == "slurmctld" for name, *_ in self._daemons):
            _quiet("scancel", "--full", f"--partition={PARTITION}")
            deadline = time.time() + 60
            while time.time() < deadline and _quiet("squeue", "-h").stdout.strip():
                time.sleep(1)
        for _name, process, stop in reversed(self._daemons):
            session = process.pid
            members = [p for p in psutil.process_iter() if _session(p) == session]
            for member in members:
                try:
                    member.send_signal(stop)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(members, timeout=30)
            for member in alive:
                try:
                    member.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=10)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self._daemons.clear()
        # Job steps (slurmstepd) leave slurmd's session; the cluster is the machine's only SLURM.
        strays = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "slurmstepd"]
        for stray in strays:
            stray.kill()
        psutil.wait_procs(strays, timeout=10)
        if self._wrote_system_conf and SYSTEM_SLURM_CONF.exists():
            SYSTEM_SLURM_CONF.unlink()

    _wrote_system_conf = False
    _ray_env: dict = {}

    def _start_munge(self):
        folder = self.folder / "munge"
        folder.mkdir(mode=0o755)
        key = folder / "munge.key"
        subprocess.run([_command("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self.munge_socket = folder / "munge.socket"
        munged = self._daemon(
            "munged",
            [
                _command("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--seed-file={folder / 'munged.seed'}",
                f"--log-file={self.log('munged.file.log')}",
            ],
        )
        _wait(lambda: self.munge_socket.exists(), "munged", munged, log=self.log("munged.log"))

    def _start_mariadb(self):
        """The database of slurmdbd, SLURM's accounting (what sacct reads)."""
        data = self.folder / "mariadb"
        self.ports["mariadb"] = free_port()
        installed = _quiet(
            _command("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={data}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        )
        if installed.returncode:
            raise RuntimeError(f"mariadb-install-db failed:\n{installed.stdout[-2000:]}{installed.stderr[-2000:]}")
        mariadbd = self._daemon(
            "mariadbd",
            [
                _command("mariadbd"),
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--bind-address=127.0.0.1",
                f"--port={self.ports['mariadb']}",
                f"--socket={self.folder / 'mariadb.socket'}",
                f"--pid-file={self.folder / 'mariadb.pid'}",
                "--innodb-buffer-pool-size=64M",
            ],
        )
        _wait(
            lambda: socket.create_connection(("127.0.0.1", self.ports["mariadb"]), timeout=1).close() is None,
            "MariaDB",
            mariadbd,
            log=self.log("mariadbd.log"),
        )

    def _slurm_conf(self) -> str:
        return "\n".join(
            [
                f"ClusterName={CLUSTER_NAME}",
                f"SlurmctldHost={self.node}(127.0.0.1)",
                f"SlurmctldPort={self.ports['slurmctld']}",
                f"SlurmdPort={self.ports['slurmd']}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={self.munge_socket}",
                f"StateSaveLocation={self.folder / 'slurmctld'}",
                f"SlurmdSpoolDir={self.folder / 'slurmd'}",
                f"SlurmctldPidFile={self.folder / 'slurmctld.pid'}",
                f"SlurmdPidFile={self.folder / 'slurmd.pid'}",
                # No cgroups on a test machine: Linux process tracking, no task plugin.
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/linux",
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.ports['slurmdbd']}",
                f"AccountingStoragePass={self.munge_socket}",  # the munge socket, for slurmdbd
                "AccountingStoreFlags=job_comment",  # sacct shows each job's rule (the plugin's comment)
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "DefMemPerCPU=1000",
                "MinJobAge=600",
                "ReturnToService=2",
                "MpiDefault=none",
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
                f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def _slurmdbd_conf(self) -> str:
        return "\n".join(
            [
                "AuthType=auth/munge",
                f"AuthInfo=socket={self.munge_socket}",
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={self.ports['slurmdbd']}",
                "SlurmUser=root",
                f"PidFile={self.folder / 'slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={self.ports['mariadb']}",
                "StorageUser=root",
                "StorageLoc=slurm_acct_db",
                "",
            ]
        )

    def _start_slurm(self):
        for name in ("slurmctld", "slurmd", "slurmdbd"):
            self.ports[name] = free_port()
        for name in ("slurmctld", "slurmd"):
            (self.folder / name).mkdir()
        conf = self.folder / "slurm.conf"
        conf.write_text(self._slurm_conf())
        dbd_conf = self.folder / "slurmdbd.conf"
        dbd_conf.write_text(self._slurmdbd_conf())
        dbd_conf.chmod(0o600)  # slurmdbd refuses a readable one: it may hold a password
        SYSTEM_SLURM_CONF.parent.mkdir(exist_ok=True)
        SYSTEM_SLURM_CONF.write_text(conf.read_text())
        self._wrote_system_conf = True
        env = {**os.environ, "SLURM_CONF": str(conf)}
        slurmdbd = self._daemon("slurmdbd", [_command("slurmdbd"), "-D"], env=env)
        _wait(
            lambda: socket.create_connection(("127.0.0.1", self.ports["slurmdbd"]), timeout=1).close() is None,
            "slurmdbd",
            slurmdbd,
            log=self.log("slurmdbd.log"),
        )
        # The cluster must be known to the accounting before slurmctld registers with it.
        _quiet("sacctmgr", "-i", "add", "cluster", CLUSTER_NAME)
        slurmctld = self._daemon("slurmctld", [_command("slurmctld"), "-D", "-c"], env=env)
        _wait(lambda: "UP" in _quiet("scontrol", "ping").stdout, "slurmctld", slurmctld, log=self.log("slurmctld.log"))
        slurmd = self._daemon("slurmd", [_command("slurmd"), "-D", "-N", self.node], env=env)
        _wait(
            lambda: _quiet("sinfo", "-h", "-N", "-o", "%T").stdout.strip() == "idle",
            "slurmd (node idle)",
            slurmd,
            log=self.log("slurmd.log"),
        )

    def _start_postgres(self):
        """PostgreSQL on a Unix socket in the folder, run by Debian's `postgres` user."""
        data, sockets = self.folder / "postgres", self.folder / "pg"
        for folder in (data, sockets):
            folder.mkdir()
            shutil.chown(folder, "postgres")
        self.ports["postgres"] = free_port()
        binaries = _postgres_bin()
        initdb = _quiet(str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "mlflow", user="postgres")
        if initdb.returncode:
            raise RuntimeError(f"initdb failed:\n{initdb.stdout[-2000:]}{initdb.stderr[-2000:]}")
        postgres = self._daemon(
            "postgres",
            [
                str(binaries / "postgres"),
                "-D",
                str(data),
                "-p",
                str(self.ports["postgres"]),
                "-c",
                "listen_addresses=",
                "-c",
                f"unix_socket_directories={sockets}",
            ],
            stop=signal.SIGINT,  # PostgreSQL's fast shutdown
            user="postgres",
        )
        connect = ["-h", str(sockets), "-p", str(self.ports["postgres"]), "-U", "mlflow"]
        _wait(
            lambda: _quiet(str(binaries / "pg_isready"), *connect).returncode == 0,
            "PostgreSQL",
            postgres,
            log=self.log("postgres.log"),
        )
        created = _quiet(str(binaries / "createdb"), *connect, "mlflow", user="postgres")
        if created.returncode:
            raise RuntimeError(f"createdb failed: {created.stderr}")
        self.postgres_uri = f"postgresql://mlflow@/mlflow?host={sockets}&port={self.ports['postgres']}"

    def _start_mlflow(self):
        self.ports["mlflow"] = free_port()
        server = self._daemon(
            "mlflow",
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                self.postgres_uri,
                "--artifacts-destination",
                str(self.folder / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.ports["mlflow"]),
                "--workers",
                "1",
            ],
        )
        _wait(
            lambda: urllib.request.urlopen(f"{self.tracking_uri}/health", timeout=2).status == 200,
            "mlflow server",
            server,
            timeout=180,
            log=self.log("mlflow.log"),
        )

    def _start_ray(self):
        """A Ray head on 127.0.0.1 (multi-node mode off, so it binds no other interface), with
        Ray's token authentication: its token in the folder, handed to clients by the env."""
        self.ports["ray"] = free_port()
        token = self.folder / "ray_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self._ray_env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        env = {**os.environ, **self._ray_env}
        ray = str(Path(sys.executable).parent / "ray")
        head = self._daemon(
            "ray",
            [
                ray,
                "start",
                "--head",
                "--block",
                "--node-ip-address=127.0.0.1",
                f"--port={self.ports['ray']}",
                f"--num-cpus={self.cpus}",
                "--num-gpus=0",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={self.folder / 'ray'}",
                "--object-store-memory=300000000",
            ],
            env=env,
        )
        _wait(
            lambda: _quiet(ray, "status", f"--address={self.ray_address}", env=env).returncode == 0,
            "Ray head",
            head,
            timeout=180,
            log=self.log("ray.log"),
        )


def _session(process) -> int | None:
    try:
        return os.getsid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None
