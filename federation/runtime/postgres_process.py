"""A throwaway PostgreSQL server: what the history store's tests and `bench/history.py` run against.

Real PostgreSQL, never a mock, so that the SQL, the conflict clauses, the migrations and the timings
are the production ones. The server is Debian's `postgresql` (`/usr/lib/postgresql/<major>/bin`, or
`initdb` on PATH); `make test` installs it where it is missing. PostgreSQL refuses to run as root, so
when we are root the server runs as the `postgres` system user, in a data directory of its own under
the system temp dir (pytest's per-user temp dirs are closed to other users). It listens on a free
loopback port and on a unix socket in that directory, trusts local connections (nothing but loopback
reaches it), and is stopped with a fast shutdown, which ends open sessions rather than waiting.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import psycopg

from datasync.loopback_ports import free_port
from federation.errors import GpufedError

SUPERUSER = "gpufed"
_SYSTEM_USER = "postgres"


def _spawn_as(
    command: list[str], user: tuple[int, int] | None, *, dies_with_us: bool
) -> tuple[list[str], dict[str, object]]:
    """The argv and Popen's extra arguments that run `command` as `user` (uid, gid; None: as we are)
    and, with `dies_with_us`, have the kernel send it SIGQUIT when the process starting it dies.

    Both through util-linux's `setpriv`, which Debian always has, rather than Popen's `user`/`group`:
    those make subprocess fork() instead of vfork() (a setuid in a vfork child is unsafe), and a
    fork() runs gRPC's fork handlers in the child; with gRPC's threads running in the process that
    starts the server (a test worker), the child crashed before it could exec (exit -11, "epoll_wait
    error: Bad file descriptor", seen in a fresh-clone run). The death signal is set after the switch
    (the kernel clears it on a change of user): a test run that is SIGKILLed runs no atexit hook, and
    SIGQUIT is PostgreSQL's immediate shutdown, which takes the backends down and releases the shared
    memory. Not datasync's Python shim: the `postgres` user may not read our interpreter (a pyenv
    under /root). Without setpriv, Popen switches the user and the server is only
    stopped by `stop()` and atexit.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        popen_user = {} if user is None else {"user": user[0], "group": user[1], "extra_groups": []}
        return command, popen_user
    switch = [] if user is None else [f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
    death = ["--pdeathsig", "QUIT"] if dies_with_us else []
    if not switch and not death:
        return command, {}
    return [setpriv, *switch, *death, "--", *command], {}


class PostgresUnavailable(GpufedError):
    """No PostgreSQL server binaries here, or the server did not start. Says which and why."""


def postgres_bin_dir() -> Path:
    """Where Debian's server binaries are: `initdb` on PATH, else the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(on_path).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise PostgresUnavailable(
            "no PostgreSQL server: install Debian's postgresql (apt-get install postgresql; `make test` does)"
        )
    return Path(found[-1]).parent


class PostgresProcess:
    """One PostgreSQL on 127.0.0.1 with a temporary data dir. A context manager: start, then stop."""

    def __init__(self, *, durable: bool = False, settings: Mapping[str, str] | None = None) -> None:
        # durable=False turns fsync off: right for tests (the data dir is thrown away), wrong for a
        # benchmark of write throughput, which passes durable=True. `settings`: more `-c name=value`.
        self._durable = durable
        self._settings = dict(settings or {})
        self._bin = postgres_bin_dir()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self.port = 0

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _server_user(self) -> tuple[int, int] | None:
        """The (uid, gid) to run PostgreSQL as, which owns its directory; None when not root."""
        if os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam(_SYSTEM_USER)
        except KeyError as error:
            raise PostgresUnavailable(
                f"running as root and there is no {_SYSTEM_USER!r} user to run PostgreSQL as"
            ) from error
        assert self._dir is not None
        for path in (self._dir, *self._dir.rglob("*")):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return (entry.pw_uid, entry.pw_gid)

    def start(self, timeout_s: float = 30.0) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gpufed-pg-"))
        data = self._dir / "data"
        log = self._dir / "postgres.log"
        log.touch()
        user = self._server_user()
        initdb_argv, as_user = _spawn_as(
            [
                str(self._bin / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            user,
            dies_with_us=False,
        )
        initdb = subprocess.run(
            initdb_argv,
            capture_output=True,
            cwd=self._dir,
            **as_user,  # type: ignore[call-overload]
        )
        if initdb.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {initdb.stderr.decode(errors='replace')[-2000:]}")
        self.port = free_port()
        settings = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        command = [
            str(self._bin / "postgres"),
            "-D", str(data),
            "-p", str(self.port),
            "-h", "127.0.0.1",
            "-k", str(self._dir),
            *([] if self._durable else settings),
            *(arg for name, value in self._settings.items() for arg in ("-c", f"{name}={value}")),
        ]  # fmt: skip
        server_argv, as_user = _spawn_as(command, user, dies_with_us=True)
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                server_argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,
                **as_user,  # type: ignore[call-overload]
            )
        atexit.register(self.stop)
        self._wait_ready(timeout_s, log)

    def _wait_ready(self, timeout_s: float, log: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited ({self._proc.returncode}): {log.read_text()[-2000:]}"
                )
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    # Read the log before stop() removes the directory it is in.
                    tail = log.read_text()[-2000:]
                    self.stop()
                    raise PostgresUnavailable(f"postgres not ready in {timeout_s}s: {tail}") from error
                time.sleep(0.05)

    def create_database(self, name: str) -> str:
        """A new empty database; returns its DSN. Tests take one each, so none sees another's rows."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Fast shutdown (SIGINT: open sessions are ended, not waited for), then the data dir goes."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                # SIGQUIT is PostgreSQL's immediate shutdown: the postmaster takes its backends down.
                proc.send_signal(signal.SIGQUIT)
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PostgresProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
