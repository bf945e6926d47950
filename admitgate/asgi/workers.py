"""Several worker processes of one server: ``uvicorn --workers N``, gunicorn ``-w N``.

Each worker is a process of its own with a gate of its own. Two things must not silently multiply:

* **the rate.** ``rate`` is what the service can take. :func:`detect` reads how many workers the
  server runs from its own command line (``--workers``/``-w``, ``WEB_CONCURRENCY``), and the middleware
  gives each worker its share (see ``AdmitGate(workers=...)``). Workers started some other way
  (``uvicorn.run(..., workers=N)`` in code, a gunicorn config file) cannot be counted from outside:
  declare the count, or share one budget through Redis.
* **the ticket secret.** A ticket signed by one worker must be known by the others. Without a secret
  typed in, the workers of one server share one: :func:`worker_secret` keeps 32 random bytes in a file
  of the user's own private directory, named after the server's master process (its pid and start
  time, so a reused pid is another server). The first worker creates it; the others read it.

Why a file: uvicorn's supervisor never imports the app, so nothing of ours runs in the master to hand
the workers a secret through the environment; the master's pid is the one thing all its workers share.
The file is written to a temporary name (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600) and published
with ``link``, which fails if another worker won the race, so a reader never sees a half-written
secret. The directory is ``$XDG_RUNTIME_DIR`` (a per-user tmpfs) or ``/tmp/admitgate-<uid>``, and it
is used only if it is a real directory owned by this user and closed to everyone else (mode 0700);
otherwise, or on any I/O error, the worker signs with a secret of its own and says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("admitgate")

#: Bytes of a worker-shared ticket secret.
SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class Server:
    """The multi-process server this process is a worker of. ``workers``: how many (None: unknown)."""

    workers: int | None
    how: str  # the command line that says so, for messages: "uvicorn --workers 2"


def detect(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Server | None:
    """The server this process is one of several workers of, read from its command line and environment
    (``argv``/``env``: default this process's); None for a server of one process, or one not recognised."""
    argv = sys.argv if argv is None else argv
    env = os.environ if env is None else env
    if not argv:
        return None
    program = argv[0].replace("\\", "/")
    args = list(argv[1:])
    if program.endswith(("/uvicorn", "/uvicorn/__main__.py")) or program == "uvicorn":
        if "--reload" in args:  # the reloader runs one worker
            return None
        count = _option(args, ("--workers",)) or _count(env.get("WEB_CONCURRENCY"))
        return Server(count, f"uvicorn --workers {count}") if count and count > 1 else None
    if program.endswith("/gunicorn") or program == "gunicorn":
        args += shlex.split(env.get("GUNICORN_CMD_ARGS", ""))
        count = _option(args, ("-w", "--workers")) or _count(env.get("WEB_CONCURRENCY"))
        if count is None and ("-c" in args or "--config" in args or any(a.startswith("--config=") for a in args)
                              or Path("gunicorn.conf.py").exists()):  # fmt: skip
            return Server(None, "gunicorn (workers set in its config file)")
        count = count or 1
        return Server(count, f"gunicorn -w {count}") if count > 1 else None
    return None


def _option(args: list[str], names: tuple[str, ...]) -> int | None:
    """The last value of an integer option (``--workers 2``, ``--workers=2``, ``-w2``), or None."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = _count(args[i + 1]) or found
            elif arg.startswith(name + "=") or (len(name) == 2 and arg.startswith(name) and len(arg) > 2):
                found = _count(arg[len(name) :].lstrip("=")) or found
    return found


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def worker_secret(directory: Path | None = None, master: int | None = None) -> bytes | None:
    """The ticket secret the workers of this server share, from the file of ``master`` (default: the parent
    process) in ``directory`` (default: :func:`private_directory`); None if it cannot be had safely."""
    master = os.getppid() if master is None else master
    try:
        directory = private_directory() if directory is None else directory
        name = directory / f"ticket-{master}-{_started(master)}.key"
        try:
            return _read(name)
        except FileNotFoundError:
            _publish(directory, name)
            _forget_dead_masters(directory)
            return _read(name)
    except (OSError, ValueError) as exc:
        log.warning("admitgate: the workers of this server cannot share a ticket secret (%s); each signs tickets "
                    "with its own, so a ticket is known only by the worker that issued it: pass ticket=<secret> "
                    "(or ADMITGATE_TICKET)", exc)  # fmt: skip
        return None


def private_directory() -> Path:
    """This user's directory for worker secrets: created mode 0700, and refused unless it is private."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and _private(Path(runtime)) else Path(tempfile.gettempdir())
    path = base / f"admitgate-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if not _private(path):
        raise ValueError(f"{path} is not a directory of this user's that only it can open")
    return path


def _private(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from /proc), so a reused pid names another
    server; "0" where /proc is not there; ValueError if the process is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            raise ValueError(f"the master process {pid} is gone") from None
        return "0"
    return data[data.rindex(b")") + 2 :].split()[19].decode()


def _read(name: Path) -> bytes:
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise ValueError(f"{name} is not a private file of this user's")
        secret = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"{name} does not hold a secret")
    return secret


def _publish(directory: Path, name: Path) -> None:
    """Write a fresh secret to a private temporary file, then link it to ``name`` unless a worker did first."""
    temporary = directory / f".{name.name}.{os.getpid()}.{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temporary, flags, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with contextlib.suppress(FileExistsError):  # another worker published first: its secret is the one
            os.link(temporary, name)
    finally:
        os.unlink(temporary)


def _forget_dead_masters(directory: Path) -> None:
    """Remove the secrets of servers whose master process is gone (or whose pid is another process now)."""
    for path in directory.glob("ticket-*-*.key"):
        _, pid, started = path.stem.split("-", 2)
        try:
            alive = pid.isdigit() and _started(int(pid)) == started
        except ValueError:
            alive = False
        if not alive:
            with contextlib.suppress(OSError):
                path.unlink()
