"""The cause of a failure in words a user can act on: the OS error, the TLS alert or
verification failure, a timeout's length. Never an empty string (a reset or a timeout has no
message of its own in Python), so a tool's or client's error line always says why."""

from __future__ import annotations

import errno
import os
import ssl


def cause(e: BaseException, *, timeout: float | None = None, tls: bool = False) -> str:
    """`e` as one line. `tls`: the connection was a TLS one, so a reset or an EOF before the
    handshake ended most likely means the other end does not speak TLS."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {e.verify_message or e.reason}"
    if isinstance(e, ssl.SSLError):
        # e.reason is the alert or OpenSSL reason (TLSV1_ALERT_UNKNOWN_CA, WRONG_VERSION_NUMBER, ...)
        text = " ".join(str(e).split()) or str(e.reason or type(e).__name__)
        hint = " (is the listener plaintext?)" if e.reason in ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING") \
            or isinstance(e, ssl.SSLEOFError) else ""
        return f"TLS error: {text}{hint}"
    if isinstance(e, TimeoutError):
        return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
    if isinstance(e, ConnectionError) and tls:
        return f"{_os_text(e)} during the TLS handshake (is the listener plaintext?)"
    if isinstance(e, OSError):
        return _os_text(e)
    text = " ".join(str(e).split())
    return text or type(e).__name__


def _os_text(e: OSError) -> str:
    text = " ".join(str(e).split())
    if text:
        return text
    known: dict[type[OSError], int] = {ConnectionResetError: errno.ECONNRESET, ConnectionRefusedError: errno.ECONNREFUSED,
                                       ConnectionAbortedError: errno.ECONNABORTED, BrokenPipeError: errno.EPIPE}
    code = e.errno or known.get(type(e))
    return f"[Errno {code}] {os.strerror(code)}" if code else type(e).__name__
