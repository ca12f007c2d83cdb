"""Test and dev certificates (PEM), made with the `cryptography` package: a CA, a server
certificate for the given host names and IPs, and a client certificate, all signed by the CA.

Used by `make run-secure` and the secure test clusters; never for production.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "strata"), x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def ensure_certs(directory: Path, hosts: list[str] | tuple[str, ...] = ("localhost", "127.0.0.1")) -> CertFiles:
    """The certificates already in `directory` (a restarted dev cluster keeps its CA, so the
    clients' settings stay valid), else new ones."""
    files = CertFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                      directory / "client.pem", directory / "client.key")
    if all(p.exists() for p in (files.ca, files.server_cert, files.server_key, files.client_cert, files.client_key)):
        return files
    return make_certs(directory, hosts)


def make_certs(directory: Path, hosts: list[str] | tuple[str, ...] = ("localhost", "127.0.0.1"),
               days: int = 30) -> CertFiles:
    """Write ca.pem, server.pem/server.key (SANs: `hosts`), client.pem/client.key (CN=client)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("strata-test-ca")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, sans: list[x509.GeneralName], usage) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_name).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now)
             .not_valid_after(now + datetime.timedelta(days=days))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256()), key

    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    from cryptography.x509.oid import ExtendedKeyUsageOID

    # nodes present the server certificate to their peers too (mutual TLS between nodes)
    server, server_key = leaf(hosts[0] if hosts else "localhost", sans,
                              [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    client, client_key = leaf("client", [], [ExtendedKeyUsageOID.CLIENT_AUTH])
    files = CertFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                      directory / "client.pem", directory / "client.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(files.server_key, server_key)
    files.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(files.client_key, client_key)
    return files
