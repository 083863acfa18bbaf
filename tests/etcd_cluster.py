"""A three-member etcd cluster on loopback, and the certificates for one that demands client TLS.

A real deployment runs etcd as a cluster, so the crash and HA tests run against one too: three real
etcd processes with peer and client URLs on free loopback ports, each killable and restartable on
its own data dir and ports. The certificates come from openssl, as an operator would make them: a
CA, a certificate per member (IP SAN 127.0.0.1, server and client use: the members also present it
to each other's health probe), a client certificate for gpufed, and a second CA with a client
certificate of its own, which the cluster must refuse.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from datasync.loopback_ports import free_ports
from federation.runtime.etcd_process import EtcdProcess, EtcdServerTls
from federation.store.kv_etcd_channel import EtcdTls


@dataclass(frozen=True, slots=True)
class Certs:
    server: EtcdServerTls
    client: EtcdTls
    # Signed by another CA: a client holding this must be refused.
    stranger: EtcdTls


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
    )  # fmt: skip
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], *, server: bool) -> tuple[Path, Path]:
    cert, key, csr = directory / f"{name}.pem", directory / f"{name}-key.pem", directory / f"{name}.csr"
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    usage = "serverAuth,clientAuth" if server else "clientAuth"
    ext = directory / f"{name}.ext"
    ext.write_text(
        f"extendedKeyUsage={usage}\n" + ("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else "")
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "etcd-ca")
    member = _leaf(directory, "etcd-member", ca, server=True)
    client = _leaf(directory, "gpufed-client", ca, server=False)
    other_ca = _ca(directory, "other-ca")
    stranger = _leaf(directory, "stranger-client", other_ca, server=False)
    return Certs(
        server=EtcdServerTls(ca=ca[0], cert=member[0], key=member[1]),
        client=EtcdTls(ca=ca[0], cert=client[0], key=client[1]),
        stranger=EtcdTls(ca=ca[0], cert=stranger[0], key=stranger[1]),
    )


class EtcdCluster:
    """Three (or `size`) etcd members on loopback. `endpoint` is their client endpoints, comma-joined,
    as `gpufed serve --etcd` and `EtcdKv.connect` take them."""

    def __init__(self, base_dir: Path, *, size: int = 3, tls: EtcdServerTls | None = None) -> None:
        drawn = free_ports(2 * size)
        ports = list(zip(drawn[0::2], drawn[1::2], strict=True))
        initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        self.members = [
            EtcdProcess(
                base_dir / f"m{i}",
                client_port=client,
                peer_port=peer,
                name=f"m{i}",
                initial_cluster=initial,
                tls=tls,
            )
            for i, (client, peer) in enumerate(ports)
        ]

    @property
    def endpoint(self) -> str:
        return ",".join(m.client_url for m in self.members)

    def start(self, timeout_s: float = 30.0) -> None:
        # A member is healthy only once a quorum runs: spawn them all, then wait for each.
        for member in self.members:
            member.start(wait=False)
        for member in self.members:
            member.wait_healthy(timeout_s)

    def kill(self, index: int) -> None:
        self.members[index].kill()

    def restart(self, index: int, timeout_s: float = 30.0) -> None:
        """Start a killed member again on its data dir and ports; it is healthy once it has a leader."""
        member = self.members[index]
        member.start(wait=False)
        member.wait_healthy(timeout_s)

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
