"""Several workers of one server: the rate is shared, not multiplied, and tickets are known by every worker
(``admitgate.asgi.workers``); a bad configuration stops a real uvicorn with its default flags."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from admitgate.asgi.workers import detect, worker_secret

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("argv", "env", "workers"),
    [
        (["/venv/bin/uvicorn", "app:app", "--workers", "2"], {}, 2),
        (["uvicorn", "app:app", "--workers=4"], {}, 4),
        (["/venv/bin/uvicorn", "app:app"], {"WEB_CONCURRENCY": "3"}, 3),
        (["/venv/bin/uvicorn", "app:app", "--workers", "2", "--reload"], {}, None),  # the reloader runs one
        (["/venv/bin/uvicorn", "app:app"], {}, None),
        (["/venv/bin/gunicorn", "-w", "3", "app:app"], {}, 3),
        (["/venv/bin/gunicorn", "-w3", "app:app"], {}, 3),
        (["gunicorn", "app:app"], {"GUNICORN_CMD_ARGS": "--workers 5"}, 5),
        (["/venv/bin/python", "serve.py"], {"WEB_CONCURRENCY": "3"}, None),  # not a server we can read
    ],
)
def test_detect_reads_the_worker_count_from_the_servers_command_line(argv, env, workers) -> None:
    server = detect(argv, env)
    assert (server.workers if server is not None else None) == workers


def test_a_gunicorn_config_file_means_an_unknown_count(tmp_path) -> None:
    server = detect(["gunicorn", "-c", "conf.py", "app:app"], {})
    assert server is not None and server.workers is None


def test_workers_of_one_master_share_one_secret_and_another_master_has_its_own(tmp_path) -> None:
    tmp_path.chmod(0o700)
    master = os.getpid()  # a live process: its start time names the file
    first, second = worker_secret(tmp_path, master), worker_secret(tmp_path, master)
    assert first is not None and first == second and len(first) == 32
    other = worker_secret(tmp_path, os.getppid())
    assert other is not None and other != first
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in tmp_path.iterdir())


def test_a_directory_open_to_others_is_refused(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / f"admitgate-{os.getuid()}").mkdir(0o777)
    (tmp_path / f"admitgate-{os.getuid()}").chmod(0o777)  # (mkdir's mode is masked by the umask)
    assert worker_secret(master=os.getpid()) is None
    assert "cannot share a ticket secret" in caplog.text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def uvicorn(app: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": ""}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--port", str(port), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.integration
def test_two_uvicorn_workers_share_the_rate_and_know_each_others_tickets() -> None:
    proc, base = uvicorn("tests.workers_app:app", "--workers", "2")
    try:
        seen: dict[int, dict] = {}
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            try:
                with httpx.Client(base_url=base) as client:  # a new connection each time: either worker
                    body = client.get("/who").json()
                seen[body["pid"]] = body
            except httpx.TransportError:
                time.sleep(0.2)  # still starting
        assert len(seen) == 2, "never reached both workers"
        assert [w["rate"] for w in seen.values()] == [10.0, 10.0]  # rate=20 is the server's: 10 each
        tickets = {pid: w["ticket"] for pid, w in seen.items()}
        checked: set[tuple[int, int]] = set()
        while not any(a != b for a, b in checked) and time.monotonic() < deadline:
            for signer, ticket in tickets.items():
                with httpx.Client(base_url=base) as client:
                    body = client.get("/verify", params={"ticket": ticket}).json()
                assert body["known"], (signer, body["pid"])
                checked.add((signer, body["pid"]))
        assert {(a, b) for a, b in checked if a != b}, "no ticket was checked by the other worker"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.integration
def test_a_bad_configuration_stops_uvicorn_with_its_default_flags() -> None:
    proc, _ = uvicorn("tests.workers_app:bad")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out  # uvicorn's "Application startup failed"
    assert "rate" in out and "Application startup failed" in out


def test_each_worker_admits_its_share_of_the_rate_and_burst_but_at_least_one_token() -> None:
    from admitgate import Settings
    from admitgate.asgi.build import gate_of

    gate = gate_of(None, 20, Settings(burst=8), 4, None, False, 0.0)
    assert gate.static_rate == 5 and gate.pacer.burst == 2
    assert gate_of(None, 5, Settings(burst=1), 2, None, False, 0.0).pacer.burst == 1  # not half a token
