"""`ssl` contexts from the mTLS files (shared.internal_auth.TlsFiles) for what is not
gRPC: the delivery link. The same checks as gRPC's mTLS: each side shows its cert and
requires the other's, signed by the CA."""

from __future__ import annotations

import os
import ssl
import tempfile

from shared.internal_auth import TlsFiles

__all__ = ["client_context", "server_context"]


def _load_chain(context: ssl.SSLContext, tls: TlsFiles) -> None:
    # `load_cert_chain` takes only paths: the PEM bytes go to a private temporary
    # directory for the call, and are removed at once.
    with tempfile.TemporaryDirectory(prefix="imroute-tls-") as folder:
        os.chmod(folder, 0o700)
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, data in ((cert, tls.cert), (key, tls.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert, key)
    context.load_verify_locations(cadata=tls.ca.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    """The gateway's side: its cert, and a client cert the CA signed required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(context, tls)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(tls: TlsFiles) -> ssl.SSLContext:
    """The push service's side: its cert, and the gateway's checked against the CA and
    the name it is dialled by (or `tls.server_name`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _load_chain(context, tls)
    return context
