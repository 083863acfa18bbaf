"""HTTPS for a simulated cluster, with a certificate made for it on start.

kubectl sends a bearer token only over TLS: against a plain-HTTP simulator it leaves the
Authorization header off, so a token-holding kubeconfig (the one `gpufed cluster join` writes) would
be refused however its account was authorized. A cluster configured with `tls: true` serves HTTPS
with a self-signed certificate for 127.0.0.1 and localhost, made by `openssl` (as the project's other
TLS tests make theirs), and its kubeconfig carries that certificate as the cluster's CA.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


class TlsUnavailable(RuntimeError):
    """openssl is missing or failed: the cluster cannot serve HTTPS."""


@dataclass(frozen=True, slots=True)
class ServingCert:
    directory: Path
    cert_pem: bytes

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.directory / "tls.crt", self.directory / "tls.key")
        return context

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def self_signed(host: str, timeout_s: float = 30.0) -> ServingCert:
    directory = Path(tempfile.mkdtemp(prefix="gpufed-sim-tls-"))
    directory.chmod(0o700)
    names = f"subjectAltName=IP:{host},IP:127.0.0.1,DNS:localhost"
    argv = [
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "30", "-subj", "/CN=gpufed-sim", "-addext", names,
        "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt"),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except OSError as error:
        shutil.rmtree(directory, ignore_errors=True)
        raise TlsUnavailable(f"openssl could not run: {error}") from error
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise TlsUnavailable(f"openssl failed: {done.stderr.strip()}")
    return ServingCert(directory, (directory / "tls.crt").read_bytes())
