"""A certificate authority made for one run, and a server certificate from it for loopback stores.

Real object stores are reached over HTTPS; the local SeaweedFS of the benchmark and the tests serves
HTTPS with a certificate from a CA made here (by `openssl`, as an operator would make one), and clients
trust exactly that CA (`S3StoreConfig(ca_bundle=...)`, rclone's `--ca-cert`). Nothing here is a
secret worth keeping: the keys live in the run's own directory (mode 0600) and expire in two days.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from datasync.errors import DatasyncError

_DAYS = "2"


class CertificateError(DatasyncError):
    """openssl is missing or refused to make a certificate."""

    retryable = False


@dataclass(frozen=True, slots=True)
class ServerCertificate:
    """A CA's certificate (what clients trust) and a server's certificate and key signed by it."""

    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise CertificateError("openssl is needed to make a CA for a TLS store; it is not on PATH")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {done.stderr.strip()[-400:]}")


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA (P-256): its certificate and key, `<name>.pem` and `<name>-key.pem`."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", _DAYS, "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def make_server_certificate(
    directory: Path,
    name: str,
    ca: tuple[Path, Path],
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    days: str = _DAYS,
) -> tuple[Path, Path]:
    """A server certificate for `hosts` (IP addresses and DNS names as subjectAltNames), signed by `ca`.
    `days` may be negative-free only: an expired certificate is made by `make_expired_certificate`."""
    cert, key, csr = directory / f"{name}.pem", directory / f"{name}-key.pem", directory / f"{name}.csr"
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    ext = directory / f"{name}.ext"
    names = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    ext.write_text(f"extendedKeyUsage=serverAuth\nsubjectAltName={names}\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-out", str(cert), "-days", days, "-extfile", str(ext),
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def make_expired_certificate(directory: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 signed by `ca` whose validity ended yesterday (openssl's
    `ca` command with explicit dates: `x509 -req` cannot back-date)."""
    cert, key, csr = directory / f"{name}.pem", directory / f"{name}-key.pem", directory / f"{name}.csr"
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    db = directory / f"{name}-ca-db"
    db.mkdir(exist_ok=True)
    (db / "index.txt").write_text("")
    (db / "serial").write_text("1000\n")
    config = directory / f"{name}-ca.cnf"
    config.write_text(
        "[ca]\ndefault_ca=local\n[local]\n"
        f"dir={db}\ndatabase=$dir/index.txt\nserial=$dir/serial\nnew_certs_dir=$dir\n"
        "default_md=sha256\npolicy=anything\ncopy_extensions=none\nx509_extensions=server\n"
        "[anything]\ncommonName=supplied\n"
        "[server]\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl(
        "ca", "-batch", "-config", str(config), "-in", str(csr), "-out", str(cert),
        "-cert", str(ca[0]), "-keyfile", str(ca[1]),
        "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-notext",
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def make_server_tls(directory: Path, name: str = "store") -> ServerCertificate:
    """A new CA and a loopback server certificate from it, in `directory`."""
    ca = make_ca(directory, f"{name}-ca")
    cert, key = make_server_certificate(directory, name, ca)
    return ServerCertificate(ca=ca[0], cert=cert, key=key)
