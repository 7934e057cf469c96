"""Real parts for the tests: the retryd binary built from this repository,
started on a free loopback port, and a loopback TCP proxy whose
connections a test can cut."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[3]


def build_retryd(dest_dir: str) -> str:
    """Builds cmd/retryd into dest_dir with the Go toolchain of go.mod."""
    binary = os.path.join(dest_dir, "retryd")
    subprocess.run(["go", "build", "-o", binary, "./cmd/retryd"], cwd=ROOT, check=True)
    return binary


class RetrydServer:
    """A running `retryd serve --listen 127.0.0.1:0 --log-format json`,
    with its address read from its "serving" log line."""

    def __init__(self, binary: str, *args: str, env: Optional[Dict[str, str]] = None) -> None:
        self.binary = binary
        self.args = args
        self._lines: List[str] = []
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--log-format", "json", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        found: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, args=(found,), daemon=True).start()
        try:
            addr = found.get(timeout=30)
        except queue.Empty:
            self.stop()
            raise RuntimeError("retryd did not serve within 30 s:\n" + self.logs()) from None
        if addr is None:
            self.stop()
            raise RuntimeError("retryd exited before serving:\n" + self.logs())
        self.addr: str = addr

    def _read(self, found: "queue.Queue[Optional[str]]") -> None:
        assert self.proc.stderr is not None
        served = False
        for line in self.proc.stderr:
            self._lines.append(line)
            if served:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "serving" and isinstance(rec.get("addr"), str):
                served = True
                found.put(rec["addr"])
        if not served:
            found.put(None)

    def logs(self) -> str:
        return "".join(self._lines)

    def verify(self) -> str:
        """Runs `retryd verify --server` over the event log; raises on a
        violation."""
        out = subprocess.run(
            [self.binary, "verify", "--server", self.addr], capture_output=True, text=True, timeout=60
        )
        text = out.stdout + out.stderr
        if out.returncode != 0 or not any(l.endswith(" 0 violations") for l in text.splitlines()):
            raise AssertionError(f"retryd verify --server {self.addr} (exit {out.returncode}):\n{text}")
        return text.strip()

    def kill(self) -> None:
        """SIGKILL, as a crash: no drain, no graceful stop."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s, by PID."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def verify_event_lines(binary: str, lines: List[str]) -> str:
    """Runs `retryd verify --file -` over proto-JSON event lines."""
    out = subprocess.run(
        [binary, "verify", "--file", "-"], input="".join(l + "\n" for l in lines), capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    if out.returncode != 0 or not any(l.endswith(" 0 violations") for l in text.splitlines()):
        raise AssertionError(f"retryd verify --file - (exit {out.returncode}):\n{text}")
    return text.strip()


class TCPProxy:
    """Forwards 127.0.0.1:<port> to target. cut() closes every connection
    it carries (both sides, with a reset), as a network failure would; new
    connections are forwarded again unless refuse is set. silence() makes
    every connection it carries drop what either side sends, without
    closing it, as a path that went silent would."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self.accepted = 0
        self.refuse = False
        self._closed = False
        self._silenced: Set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self.accepted += 1
                self._conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    silenced = src in self._silenced
                if not silenced:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def retarget(self, target: str) -> None:
        """Forwards new connections to target (a restarted server)."""
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))

    def silence(self) -> int:
        """Drops, from now on, whatever either side of every carried
        connection sends; the connections stay open and nothing answers
        (their TCP segments are still acknowledged: the silence is the
        application's, which is what gRPC's keepalive pings see). New
        connections are forwarded as before. Returns how many it
        silenced."""
        with self._lock:
            self._silenced.update(self._conns)
            return len(self._conns) // 2

    def cut(self) -> int:
        """Resets every carried connection; returns how many it cut."""
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            _reset(s)
        return len(conns) // 2

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


def _reset(s: socket.socket) -> None:
    """Aborts the connection with a reset. shutdown comes first: it acts at
    once, while close alone would wait for the pipe thread blocked in recv
    on the same socket."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


def temp_dir() -> str:
    return tempfile.mkdtemp(prefix="retryd-py-")
