"""Server TLS context with in-place certificate rotation.

asyncio fixes a listener's SSLContext when the socket is created, so rotation cannot swap the
listener's context. Instead the listener's context carries an SNI callback that moves every new
handshake onto the *current* context (`sslobj.context = current`). OpenSSL calls it for every
ClientHello, with or without SNI, so a rotated certificate reaches the very next connection while
the listening socket and the open connections stay as they are. A half-rotated pair (new cert, old
key) fails to load into a *new* context and is simply retried on the next poll; the current
context is never touched, so no handshake fails during the swap.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from hami import certs
from hami.observability import CERT_EXPIRY, CERT_RELOADS, get_logger

log = get_logger("hami.tls")


def make_context(cert_file: str | Path, key_file: str | Path, client_ca: str = "") -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    context.set_alpn_protocols(["http/1.1"])
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    return context


def _signature(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...]:
    """mtime, size and inode of each file (following symlinks: Secret mounts swap a ..data link)."""
    result = []
    for path in paths:
        try:
            st = os.stat(path)
            result.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            result.append((0, 0, 0))
    return tuple(result)


@dataclass
class ReloadingTls:
    cert_file: Path
    key_file: Path
    client_ca: str = ""

    def __post_init__(self) -> None:
        self.current = make_context(self.cert_file, self.key_file, self.client_ca)
        self.listener = make_context(self.cert_file, self.key_file, self.client_ca)
        self.listener.sni_callback = self._pick_current
        self._seen = _signature(self._watched())
        self._publish_expiry()

    def _watched(self) -> tuple[Path, ...]:
        extra = (Path(self.client_ca),) if self.client_ca else ()
        return (self.cert_file, self.key_file, *extra)

    def _pick_current(self, sslobj: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        sslobj.context = self.current
        return None

    def _publish_expiry(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            CERT_EXPIRY.set(certs.expiry_timestamp(self.cert_file))

    def maybe_reload(self) -> bool:
        """Called periodically; True when a new certificate was taken into use."""
        signature = _signature(self._watched())
        if signature == self._seen:
            return False
        try:
            fresh = make_context(self.cert_file, self.key_file, self.client_ca)
        except (OSError, ssl.SSLError, ValueError) as exc:
            # Typical mid-rotation state (new cert, old key): keep serving the old pair, retry later.
            CERT_RELOADS.labels(result="error").inc()
            log.warning("certificate_reload_failed", error=str(exc), cert=str(self.cert_file))
            return False
        self.current = fresh
        self._seen = signature
        CERT_RELOADS.labels(result="ok").inc()
        self._publish_expiry()
        log.info("certificate_reloaded", cert=str(self.cert_file))
        return True
