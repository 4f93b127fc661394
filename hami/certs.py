"""A CA and a serving certificate for the webhook (ECDSA P-256), made with `cryptography`.

Replaces the cfssl steps of the design document: `hami_webhook.py certs` writes the three files a
cluster install needs and prints the caBundle; `serve` without configured certificates makes the
same files in its state dir and reuses them on the next start.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "tls.crt", "tls.key"
CA_DAYS, SERVING_DAYS = 3650, 365
RENEW_BEFORE = dt.timedelta(days=30)  # a reused serving certificate closer to expiry is re-issued


@dataclass(frozen=True, slots=True)
class CertPaths:
    ca: Path
    cert: Path
    key: Path


def service_sans(service: str, namespace: str, extra: tuple[str, ...] = ()) -> list[str]:
    """localhost, loopback addresses, and every DNS form kube-apiserver may use for the Service."""
    names = ["localhost", "127.0.0.1", "::1"]
    if service:
        names += [
            service,
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local",
        ]
    names += [n for n in extra if n]
    return list(dict.fromkeys(names))


def _san_entries(names: list[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(common_name: str = "hami-webhook-ca") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_serving(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    names: list[str],
    days: int = SERVING_DAYS,
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf certificate for `names` (serving by default; CLIENT_AUTH for an API-server client cert)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[3] if len(names) > 3 else names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_san_entries(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write beside, then rename: a reader (the reloader) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def write_bundle(out_dir: str | Path, names: list[str]) -> CertPaths:
    """A fresh CA and serving certificate in `out_dir` (private key 0600)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca()
    key, cert = make_serving(ca_key, ca_cert, names)
    paths = CertPaths(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)
    _write_atomic(paths.ca, _pem_cert(ca_cert), 0o644)
    _write_atomic(paths.key, _pem_key(key), 0o600)
    _write_atomic(paths.cert, _pem_cert(cert) + _pem_cert(ca_cert), 0o644)  # leaf + chain
    return paths


def load_cert(path: str | Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def cert_names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def ensure_self_signed(state_dir: str | Path, names: list[str]) -> CertPaths:
    """Reuse the state dir's certificates when they cover `names` and are not near expiry."""
    out = Path(state_dir)
    paths = CertPaths(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)
    if all(p.exists() for p in (paths.ca, paths.cert, paths.key)):
        try:
            cert = load_cert(paths.cert)
            fresh = cert.not_valid_after_utc - _now() > RENEW_BEFORE
            if fresh and set(names) <= cert_names(cert):
                return paths
        except ValueError:
            pass  # unreadable: make new ones
    return write_bundle(out, names)


def ca_bundle_b64(ca_path: str | Path) -> str:
    """The value for a webhook configuration's clientConfig.caBundle."""
    return base64.b64encode(Path(ca_path).read_bytes()).decode("ascii")


def expiry_timestamp(cert_path: str | Path) -> float:
    return load_cert(cert_path).not_valid_after_utc.timestamp()
