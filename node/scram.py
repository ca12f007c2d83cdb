"""SASL mechanisms, sans-IO: SCRAM-SHA-256/512 (RFC 5802, RFC 7677) and PLAIN (RFC 4616).

Bytes in, bytes out. A peer's bad or wrong message raises AuthenticationError (its text goes back
to the client as SaslAuthenticate's error message); any other exception is a bug. Credentials are
Kafka's: a salted key pair per (user, mechanism), PBKDF2 iterations between 4096 and 16384.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from metadata.image import ScramCredential

# Kafka's ScramMechanism ids (AlterUserScramCredentials, UserScramCredentialRecord)
SCRAM_MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
MECHANISM_NAMES = {mid: name for name, (mid, _) in SCRAM_MECHANISMS.items()}
PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds for SCRAM-SHA-256/512
MAX_MESSAGE = 8192  # a SASL token larger than this is not a PLAIN or SCRAM message


class AuthenticationError(Exception):
    """The client failed to authenticate (wrong password, unknown user, malformed message)."""


def salted_password(hash_name: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)


def credential_from_salted(hash_name: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    return ScramCredential(
        salt=salt,
        stored_key=hashlib.new(hash_name, client_key).digest(),
        server_key=hmac.digest(salted, b"Server Key", hash_name),
        iterations=iterations,
    )


def make_credential(mechanism: str, password: str, iterations: int = 4096, salt: bytes | None = None) -> ScramCredential:
    _, hash_name = SCRAM_MECHANISMS[mechanism]
    salt = salt if salt is not None else os.urandom(32)
    return credential_from_salted(hash_name, salted_password(hash_name, password, salt, iterations), salt, iterations)


def _attributes(msg: str) -> dict[str, str]:
    out = {}
    for part in msg.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthenticationError(f"invalid SCRAM attribute {part[:20]!r}")
        out[part[0]] = part[2:]
    return out


def _decode_name(name: str) -> str:
    """RFC 5802 saslname: ',' and '=' travel as =2C and =3D."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationError("invalid user name encoding")
    return name.replace("=2C", ",").replace("=3D", "=")


def _encode_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _text(data: bytes) -> str:
    if len(data) > MAX_MESSAGE:
        raise AuthenticationError("SASL message too large")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise AuthenticationError("SASL message is not UTF-8") from None


class SaslServerMechanism:
    """One authentication exchange on the server side."""

    mechanism: str
    complete = False
    user: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        raise NotImplementedError


class PlainServer(SaslServerMechanism):
    mechanism = PLAIN

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users

    def evaluate(self, token: bytes) -> bytes:
        parts = _text(token).split("\0")
        if len(parts) != 3 or not parts[1]:
            raise AuthenticationError("invalid PLAIN message: expected authzid NUL user NUL password")
        authzid, user, password = parts
        if authzid and authzid != user:
            raise AuthenticationError("PLAIN: authorization id must be empty or the user name")
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthenticationError("Invalid username or password")
        self.user, self.complete = user, True
        return b""


class ScramServer(SaslServerMechanism):
    def __init__(self, mechanism: str, lookup: Callable[[str, int], ScramCredential | None]) -> None:
        self.mechanism = mechanism
        self.mechanism_id, self.hash_name = SCRAM_MECHANISMS[mechanism]
        self.lookup = lookup
        self.step = 0
        self.nonce = ""
        self.auth_start = ""  # client-first-bare "," server-first
        self.gs2 = ""
        self.cred: ScramCredential | None = None

    def evaluate(self, token: bytes) -> bytes:
        msg = _text(token)
        if self.step == 0:
            return self._first(msg)
        if self.step == 1:
            return self._final(msg)
        raise AuthenticationError("SCRAM exchange already complete")

    def _first(self, msg: str) -> bytes:
        # gs2-header: "n,," or "y,," or "n,a=authzid,"; channel binding ("p=") is not offered
        if msg[:2] not in ("n,", "y,"):
            raise AuthenticationError("SCRAM: channel binding is not supported" if msg[:2] == "p=" else
                                      "SCRAM: invalid client-first message")
        comma = msg.find(",", 2)
        if comma < 0:
            raise AuthenticationError("SCRAM: invalid client-first message")
        authzid = msg[2:comma]
        self.gs2 = msg[:comma + 1]
        bare = msg[comma + 1:]
        attrs = _attributes(bare)
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise AuthenticationError("SCRAM: client-first message needs n= and r=")
        user = _decode_name(attrs["n"])
        if authzid and _decode_name(authzid[2:] if authzid.startswith("a=") else authzid) != user:
            raise AuthenticationError("SCRAM: authorization id must be the user name")
        if attrs.get("tokenauth", "false").lower() == "true":
            raise AuthenticationError("SCRAM: delegation tokens are not supported")
        cred = self.lookup(user, self.mechanism_id)
        if cred is None:
            raise AuthenticationError(f"Authentication failed: Invalid user credentials ({self.mechanism})")
        self.cred, self.user = cred, user
        # alphanumeric, as Kafka's server nonce
        self.nonce = attrs["r"] + secrets.token_hex(16)
        server_first = f"r={self.nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
        self.auth_start = f"{bare},{server_first}"
        self.step = 1
        return server_first.encode()

    def _final(self, msg: str) -> bytes:
        proof_at = msg.rfind(",p=")
        if proof_at < 0:
            raise AuthenticationError("SCRAM: client-final message has no proof")
        without_proof = msg[:proof_at]
        attrs = _attributes(without_proof)
        # Kafka accepts a nonce that ends with the one it sent (librdkafka 2.0 sends the client's
        # nonce twice); the proof covers the whole message, so nothing else is loosened
        if not attrs.get("r", "").endswith(self.nonce):
            raise AuthenticationError("SCRAM: invalid nonce in the client-final message")
        if attrs.get("c") != base64.b64encode(self.gs2.encode()).decode():
            raise AuthenticationError("SCRAM: invalid channel binding")
        try:
            proof = base64.b64decode(msg[proof_at + 3:], validate=True)
        except ValueError:
            raise AuthenticationError("SCRAM: invalid proof encoding") from None
        assert self.cred is not None
        auth_message = f"{self.auth_start},{without_proof}".encode()
        signature = hmac.digest(self.cred.stored_key, auth_message, self.hash_name)
        if len(proof) != len(signature):
            raise AuthenticationError(f"Authentication failed: Invalid user credentials ({self.mechanism})")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.hash_name, client_key).digest(), self.cred.stored_key):
            raise AuthenticationError(f"Authentication failed: Invalid user credentials ({self.mechanism})")
        self.step, self.complete = 2, True
        server_sig = hmac.digest(self.cred.server_key, auth_message, self.hash_name)
        return b"v=" + base64.b64encode(server_sig)


@dataclass
class ScramClient:
    """The client side of a SCRAM exchange (Strata's own connections between nodes, the tools)."""

    mechanism: str
    user: str
    password: str
    nonce: str = ""
    bare: str = ""
    server_sig: bytes = b""

    def first(self) -> bytes:
        self.nonce = secrets.token_hex(16)
        self.bare = f"n={_encode_name(self.user)},r={self.nonce}"
        return f"n,,{self.bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        _, hash_name = SCRAM_MECHANISMS[self.mechanism]
        msg = _text(server_first)
        attrs = _attributes(msg)
        if not attrs.get("r", "").startswith(self.nonce) or "s" not in attrs or "i" not in attrs:
            raise AuthenticationError("SCRAM: invalid server-first message")
        iterations = int(attrs["i"])
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise AuthenticationError(f"SCRAM: iteration count {iterations} out of range")
        salted = salted_password(hash_name, self.password, base64.b64decode(attrs["s"]), iterations)
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
        auth_message = f"{self.bare},{msg},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", hash_name)
        stored_key = hashlib.new(hash_name, client_key).digest()
        signature = hmac.digest(stored_key, auth_message, hash_name)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_sig = hmac.digest(hmac.digest(salted, b"Server Key", hash_name), auth_message, hash_name)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check_server_final(self, server_final: bytes) -> None:
        attrs = _attributes(_text(server_final))
        if "e" in attrs:
            raise AuthenticationError(f"SCRAM: server error {attrs['e']}")
        if base64.b64decode(attrs.get("v", "")) != self.server_sig:
            raise AuthenticationError("SCRAM: the server's signature does not match")
