"""The herd's HTTP/1.1 client: lean enough that the load generator is never the bottleneck.

Used by :func:`lab.herd.run_herd` and by the benchmarks that drive a real server.
"""

from __future__ import annotations

import asyncio


class Http1Client:
    """A lean HTTP/1.1 GET client on asyncio streams: the load generator must not be the bottleneck.

    One connection, kept alive when ``keep_alive``; echoes the gate's retry cookie when
    ``cookies``; sends ``headers`` (name -> value) with every request; connects from the address ``local`` when
    given (a loopback address of 127.0.0.0/8, say: a client from a network of its own). Returns (status, Retry-After or
    None); status 0 on any transport error. ``written``: the event loop's time at which the last request was
    handed to its connection (after any connect), None until one was.
    """

    __slots__ = ("_cookie", "_extra", "_reader", "_writer", "cookies", "host", "keep_alive", "local", "port",
                 "written")  # fmt: skip

    def __init__(self, host: str, port: int, *, keep_alive: bool = True, cookies: bool = True,
                 headers: dict[str, str] | None = None, local: str | None = None) -> None:  # fmt: skip
        self.host, self.port, self.keep_alive, self.cookies, self.local = host, port, keep_alive, cookies, local
        self._extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._cookie = b""
        self.written: float | None = None

    @property
    def connected(self) -> bool:
        """Whether a connection is open (the next request then goes on it)."""
        return self._writer is not None

    async def get(self, path: str, timeout: float = 30.0, timed_out: int = 0) -> tuple[int, int | None]:
        """``timed_out``: the status returned when no response came within ``timeout`` seconds (the connection
        is then closed, as a client that gives up does); 0, as for any transport error, unless told."""
        try:
            return await asyncio.wait_for(self._get(path), timeout)
        except asyncio.TimeoutError:
            self.close()
            return timed_out, None
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            return 0, None

    async def _get(self, path: str) -> tuple[int, int | None]:
        reused = self._writer is not None
        try:
            return await self._exchange(path)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            self.close()
            if not reused:
                raise ValueError("no response") from None
            return await self._exchange(path)  # the server closed an idle keep-alive connection

    async def _exchange(self, path: str) -> tuple[int, int | None]:
        if self._writer is None:
            local = None if self.local is None else (self.local, 0)
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, local_addr=local)
        reader, writer = self._reader, self._writer
        assert reader is not None
        head = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + self.host.encode() + b"\r\n" + self._extra
        if self._cookie:
            head += b"Cookie: " + self._cookie + b"\r\n"
        if not self.keep_alive:
            head += b"Connection: close\r\n"
        writer.write(head + b"\r\n")
        self.written = asyncio.get_running_loop().time()
        status = int((await reader.readline()).split(b" ", 2)[1])
        length, retry_after, close = 0, None, not self.keep_alive
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"retry-after" and value.isdigit():
                retry_after = int(value)
            elif name == b"set-cookie" and self.cookies:
                self._cookie = value.split(b";", 1)[0]
            elif name == b"connection" and value.lower() == b"close":
                close = True
        if length:
            await reader.readexactly(length)
        if close:
            self.close()
        return status, retry_after

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
