"""Certificates: generation, SANs, reuse, `certs` command, rotation under load, client certificates."""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from hami import certs
from tests.webhook_fixture import client_context, pod, review_of, running_webhook

ROOT = Path(__file__).resolve().parent.parent


def _san(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(ext.get_values_for_type(x509.DNSName)), {str(i) for i in ext.get_values_for_type(x509.IPAddress)}


def test_bundle_is_ecdsa_p256_with_service_sans(tmp_path: Path) -> None:
    names = certs.service_sans("hami-webhook", "hami-system", ("webhook.example.com", "10.0.0.7"))
    paths = certs.write_bundle(tmp_path, names)
    cert = certs.load_cert(paths.cert)
    ca = certs.load_cert(paths.ca)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    dns, ips = _san(cert)
    assert {
        "localhost",
        "hami-webhook.hami-system.svc",
        "hami-webhook.hami-system.svc.cluster.local",
        "webhook.example.com",
    } <= dns
    assert {"127.0.0.1", "10.0.0.7"} <= ips
    assert cert.issuer == ca.subject
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert oct(paths.key.stat().st_mode & 0o777) == "0o600"
    key = serialization.load_pem_private_key(paths.key.read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_self_signed_is_reused_then_reissued_when_names_change(tmp_path: Path) -> None:
    names = certs.service_sans("svc", "ns")
    first = certs.ensure_self_signed(tmp_path, names)
    serial = certs.load_cert(first.cert).serial_number
    again = certs.ensure_self_signed(tmp_path, names)
    assert certs.load_cert(again.cert).serial_number == serial
    other = certs.ensure_self_signed(tmp_path, certs.service_sans("svc", "other-ns"))
    assert certs.load_cert(other.cert).serial_number != serial


def test_certs_command_writes_files_and_prints_ca_bundle(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "hami_webhook.py"),
            "certs",
            "--service",
            "hw",
            "--namespace",
            "gpu",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert base64.b64decode(result.stdout.strip()) == (out / "ca.pem").read_bytes()
    dns, _ = _san(certs.load_cert(out / "tls.crt"))
    assert "hw.gpu.svc" in dns


def _issue(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cert_file: Path, key_file: Path) -> int:
    key, cert = certs.make_serving(ca_key, ca_cert, certs.service_sans("hami-webhook", "hami-system"))
    # Cert first, key second, each atomically: between the two the pair does not match, as when
    # kubelet updates a Secret volume file by file. The server must keep serving the old pair.
    certs._write_atomic(cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    certs._write_atomic(key_file, certs._pem_key(key), 0o600)
    return cert.serial_number


async def test_rotation_while_a_client_keeps_connecting(tmp_path: Path) -> None:
    ca_key, ca_cert = certs.make_ca()
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    (tls_dir / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = tls_dir / "tls.crt", tls_dir / "tls.key"
    first_serial = _issue(ca_key, ca_cert, cert_file, key_file)
    overrides = {"tls": {"cert_file": str(cert_file), "key_file": str(key_file)}, "server": {"config_poll_s": 0.05}}
    async with running_webhook(tmp_path, overrides) as hook:
        seen: list[int] = []
        failures: list[BaseException] = []
        stop = asyncio.Event()

        context = client_context(tls_dir / "ca.pem")
        body = orjson.dumps(review_of(pod()))
        head = (
            f"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()

        async def client() -> None:
            # A fresh TLS connection per request, so every request shows the certificate in use.
            while not stop.is_set():
                try:
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", hook.server.port, ssl=context, server_hostname="localhost"
                    )
                    der = writer.get_extra_info("ssl_object").getpeercert(True)
                    writer.write(head + body)
                    answer = await reader.read()
                    writer.close()
                    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
                    seen.append(x509.load_der_x509_certificate(der).serial_number)
                except (OSError, AssertionError, ssl.SSLError) as exc:
                    failures.append(exc)

        task = asyncio.create_task(client())
        await asyncio.sleep(0.3)
        second_serial = _issue(ca_key, ca_cert, cert_file, key_file)
        for _ in range(100):
            if seen and seen[-1] == second_serial:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        stop.set()
        await task
    assert failures == []
    assert first_serial in seen
    assert seen[-1] == second_serial
    assert len(seen) > 10


async def test_client_certificate_required_when_client_ca_set(tmp_path: Path) -> None:
    ca_key, ca_cert = certs.make_ca("apiserver-client-ca")
    tls_dir = tmp_path / "client"
    tls_dir.mkdir()
    client_ca = tls_dir / "client-ca.pem"
    client_ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    key, cert = certs.make_serving(ca_key, ca_cert, ["kube-apiserver"], usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    (tls_dir / "client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tls_dir / "client.key").write_bytes(certs._pem_key(key))
    async with running_webhook(tmp_path, {"tls": {"client_ca": str(client_ca)}}) as hook:
        with pytest.raises(aiohttp.ClientError):
            await hook.post("validate", review_of(pod()))  # no client certificate
        context = client_context(hook.ca_file)
        context.load_cert_chain(tls_dir / "client.crt", tls_dir / "client.key")
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
            session.post(f"{hook.url}/validate", json=review_of(pod())) as response,
        ):
            assert response.status == 200


async def test_tls_below_1_2_is_refused(webhook) -> None:  # type: ignore[no-untyped-def]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _, writer = await asyncio.open_connection("127.0.0.1", webhook.server.port, ssl=context)
        writer.close()
