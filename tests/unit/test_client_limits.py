"""The CLI refuses a manifest over the server's limit itself, and sends nothing.

The server refuses anything over 256 KiB, so sending 50 MB to learn that costs the user's uplink and
the server's memory for nothing. The "server" here is a bare TCP listener that counts what arrives:
a refused manifest must not even open a connection's worth of bytes.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from click.testing import CliRunner

from federation.cli.main import cli
from federation.spec.manifest_text import MAX_MANIFEST_BYTES
from tests.e2e.harness import manifest


class CountingListener:
    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(0.2)
            with conn:
                while not self._stop.is_set():
                    try:
                        chunk = conn.recv(1 << 16)
                    except TimeoutError:
                        continue
                    if not chunk:
                        break
                    self.received += len(chunk)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


def test_the_cli_refuses_a_50_mb_manifest_locally_and_sends_nothing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    padding = "# " + "x" * 1022 + "\n"
    big.write_text(manifest("big") + padding * (50 * 1024))
    assert big.stat().st_size > 50 * 1024 * 1024
    listener = CountingListener()
    try:
        result = CliRunner().invoke(
            cli, ["--server", f"127.0.0.1:{listener.port}", "--token", "t", "submit", "-f", str(big)]
        )
    finally:
        listener.close()
    assert result.exit_code == 1, result.output
    assert "INVALID_ARGUMENT: manifest: is at least" in result.output
    assert f"over the limit of {MAX_MANIFEST_BYTES} (not sent)" in result.output
    assert listener.received == 0


def test_a_manifest_at_the_limit_in_characters_but_over_it_in_bytes_is_refused_too(tmp_path: Path) -> None:
    # Two bytes a character: under the limit counted in characters, over it in UTF-8 bytes.
    text = manifest("wide") + "# " + "é" * (MAX_MANIFEST_BYTES // 2) + "\n"
    path = tmp_path / "wide.yaml"
    path.write_text(text, encoding="utf-8")
    listener = CountingListener()
    try:
        result = CliRunner().invoke(
            cli, ["--server", f"127.0.0.1:{listener.port}", "--token", "t", "submit", "-f", str(path)]
        )
    finally:
        listener.close()
    assert result.exit_code == 1, result.output
    assert f"bytes, over the limit of {MAX_MANIFEST_BYTES} (not sent)" in result.output
    assert listener.received == 0
