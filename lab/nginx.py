"""A throwaway nginx in front of an app on loopback: its own config, logs and pid in a temp directory, on a free
port, never the system's nginx (its config and service are not touched)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .serving import free_port, stop

#: nginx's typical reverse-proxy lines, as a new user writes them: X-Forwarded-For carries no port.
TYPICAL = """
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
"""
#: The lines that let the gate recognise a client's own connection: its port in Forwarded (RFC 7239), an IPv6
#: address in brackets, and nginx's serial number of the connection (``conn``: a new connection from the same port
#: is another client); the app reads it with ``Identity(trusted_hops=1, forwarded="forwarded")``.
FORWARDED_PORT = """
        proxy_set_header Forwarded "for=\\"$forwarded_node\\";conn=$connection";
"""
WITH_PORT = TYPICAL + FORWARDED_PORT
#: Beside WITH_PORT, at http level: the client's node as RFC 7239 writes it.
NODE_MAP = """
    map $remote_addr $forwarded_node {
        ~:       "[$remote_addr]:$remote_port";
        default  "$remote_addr:$remote_port";
    }
"""

CONFIG = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_timeout 75s;
    keepalive_requests 100000;
{maps}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
{lines}
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """The nginx executable (Debian package 'nginx'); AssertionError naming it if there is none."""
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    assert path, "nginx is required (Debian package 'nginx')"
    return path


@contextlib.contextmanager
def nginx_proxy(upstream: int, lines: str = TYPICAL, *, ready_timeout: float = 15.0,
                errors: list[str] | None = None) -> Iterator[str]:  # fmt: skip
    """nginx on a free loopback port proxying to ``127.0.0.1:upstream`` with ``lines`` in its location (and the
    node map at http level); yields its base URL. Stopped (its own process, by pid) on exit; ``errors``, if given,
    then gets the lines of its error log (warnings and worse: an upstream that failed it, say)."""
    binary = nginx_binary()
    with tempfile.TemporaryDirectory(prefix="admitgate-nginx-") as tmp:
        port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(CONFIG.format(tmp=tmp, port=port, upstream=upstream, lines=lines, maps=NODE_MAP))
        log = Path(tmp) / "stderr.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen([binary, "-p", tmp, "-c", str(conf), "-g", "daemon off; user root;"],
                                    stderr=stderr)  # fmt: skip
        try:
            deadline = time.monotonic() + ready_timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"nginx exited: {log.read_text()}")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx did not start")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(proc)
            error_log = Path(tmp) / "error.log"
            if errors is not None and error_log.exists():
                errors.extend(error_log.read_text(errors="replace").splitlines())
