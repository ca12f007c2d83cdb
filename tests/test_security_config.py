"""Security without processes: listener configs fail closed with one clear line, SCRAM and PLAIN
exchanges (RFC 7677's test vector), the SASL gate's answers to bad input."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest

from broker.config import BrokerConfig
from controller.config import ControllerConfig, parse_bootstrap
from metadata.image import ScramCredential
from node.config import ConfigError, NodeConfig
from node.sasl import Authenticator
from node.scram import AuthenticationError, PlainServer, ScramClient, ScramServer, make_credential
from node.security import SaslServerConfig, parse_jaas, properties_client_security
from protocol.errors import Errors
from protocol.generated.sasl_authenticate import SaslAuthenticateRequest, SaslAuthenticateResponse
from protocol.generated.sasl_handshake import SaslHandshakeRequest, SaslHandshakeResponse
from protocol.headers import decode_response, encode_request
from tests.conftest import ROOT
from tools.certs import make_certs

BASE = {
    "process.roles": "broker", "node.id": "1", "controller.quorum.voters": "100@127.0.0.1:9091",
    "controller.listener.names": "CONTROLLER", "log.dirs": "/tmp/x",
}


def broker(**props: str) -> BrokerConfig:
    return BrokerConfig.from_node_config(NodeConfig({**BASE, **{k.replace("_", "."): v for k, v in props.items()}}))


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_plaintext_default_unchanged():
    c = broker(listeners="PLAINTEXT://127.0.0.1:9092")
    assert c.listener.listener == "PLAINTEXT" and [x.security.protocol for x in c.listeners] == ["PLAINTEXT"]
    assert c.inter_broker_security.ssl is None and not c.controller_security.sasl


def test_listeners_protocols_and_advertised(certs):
    c = broker(**{
        "listeners": "INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9093",
        "advertised.listeners": "INTERNAL://10.0.0.1:9092,EXTERNAL://broker.example:19093",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.certificate.location": str(certs.server_cert), "ssl.key.location": str(certs.server_key),
    })
    assert c.listener.listener == "INTERNAL" and c.advertised.host == "10.0.0.1"
    ext = c.listeners[1]
    assert (ext.advertised.host, ext.advertised.port, ext.security.protocol) == ("broker.example", 19093, "SASL_SSL")
    assert ext.security.ssl is not None and ext.security.sasl.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.mark.parametrize("props, says", [
    ({"listeners": "SASL_SSL://127.0.0.1:9092", "security.inter.broker.protocol": "SASL_SSL"},
     "listener SASL_SSL: ssl.certificate.location is required"),
    ({"listeners": "SSL://127.0.0.1:9092", "security.inter.broker.protocol": "SSL",
      "ssl.certificate.location": "/nonexistent.pem"}, "cannot load certificate /nonexistent.pem"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:9092", "security.inter.broker.protocol": "SASL_PLAINTEXT",
      "sasl.enabled.mechanisms": "GSSAPI"}, "SASL mechanism GSSAPI is not supported"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:9092", "security.inter.broker.protocol": "SASL_PLAINTEXT",
      "sasl.enabled.mechanisms": "PLAIN"}, "PLAIN is enabled but no user_NAME"),
    ({"listeners": "EXTERNAL://127.0.0.1:9092", "inter.broker.listener.name": "EXTERNAL"},
     "listener EXTERNAL: no security protocol"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092", "inter.broker.listener.name": "INTERNAL"},
     "inter.broker.listener.name: INTERNAL is not one of the listeners"),
    ({"listeners": "X://127.0.0.1:9092", "listener.security.protocol.map": "X:TLS"}, "is not LISTENER:"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:9092", "security.inter.broker.protocol": "SASL_PLAINTEXT",
      "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"}, "needs username and password"),
])
def test_unservable_listener_refuses_to_start(props, says):
    with pytest.raises(ConfigError, match=says):
        broker(**props)


def test_client_auth_needs_a_ca(certs):
    with pytest.raises(ConfigError, match="ssl.client.auth=required needs ssl.ca.location"):
        broker(listeners="SSL://127.0.0.1:9092", **{"security.inter.broker.protocol": "SSL",
               "ssl.certificate.location": str(certs.server_cert), "ssl.key.location": str(certs.server_key),
               "ssl.client.auth": "required"})


def test_process_refuses_with_one_line(tmp_path):
    cfg = tmp_path / "server.properties"
    cfg.write_text("\n".join(f"{k}={v}" for k, v in {**BASE, "listeners": "SASL_SSL://127.0.0.1:0",
                                                       "security.inter.broker.protocol": "SASL_SSL"}.items()))
    p = subprocess.run([sys.executable, "-m", "broker", "--config", str(cfg)], cwd=ROOT, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "ssl.certificate.location is required" in lines[0], p.stderr


def test_controller_config_and_bootstrap_credentials(certs):
    c = ControllerConfig.from_node_config(NodeConfig({
        "process.roles": "controller", "node.id": "100", "controller.quorum.voters": "100@127.0.0.1:9091",
        "listeners": "CONTROLLER://127.0.0.1:9091", "log.dirs": "/tmp/x",
        "listener.security.protocol.map": "CONTROLLER:SASL_SSL",
        "ssl.certificate.location": str(certs.server_cert), "ssl.key.location": str(certs.server_key),
        "bootstrap.scram.credentials": "SCRAM-SHA-512=[name=broker,password=s3cret];"
                                       "SCRAM-SHA-256=[name=a,password=b,iterations=8192]",
    }))
    assert c.securities[0].protocol == "SASL_SSL"
    assert c.bootstrap_scram == (("SCRAM-SHA-512", "broker", "s3cret", 4096), ("SCRAM-SHA-256", "a", "b", 8192))
    with pytest.raises(ConfigError, match="iterations must be"):
        parse_bootstrap("SCRAM-SHA-256=[name=a,password=b,iterations=10]")


def test_jaas_and_client_properties(certs):
    opts = parse_jaas('org.apache.kafka.common.security.plain.PlainLoginModule required username="a" '
                      'password="p\\"w" user_bob="x";')
    assert opts == {"username": "a", "password": 'p"w', "user_bob": "x"}
    sec = properties_client_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                                      "sasl.jaas.config": 'x required username="u" password="p";',
                                      "ssl.ca.location": str(certs.ca)}, "client.properties")
    assert (sec.mechanism, sec.username, sec.password, sec.ssl is not None) == ("SCRAM-SHA-256", "u", "p", True)


# ---------------------------------------------------------------- mechanisms
def test_scram_sha256_rfc7677_vector():
    """RFC 7677 section 3: user "user", password "pencil"."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    c = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO",
                    bare="n=user,r=rOprNGfwEbeRWgbNEkqO")
    final = c.final(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    c.check_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    assert make_credential("SCRAM-SHA-256", "pencil", 4096, salt).salt == salt


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_and_wrong_password(mech):
    creds = {("al,i=ce", 1 if mech.endswith("256") else 2): make_credential(mech, "right")}

    def run(password: str) -> ScramServer:
        server, client = ScramServer(mech, lambda u, m: creds.get((u, m))), ScramClient(mech, "al,i=ce", password)
        final = client.final(server.evaluate(client.first()))
        client.check_server_final(server.evaluate(final))
        return server

    s = run("right")
    assert s.complete and s.user == "al,i=ce"
    with pytest.raises(AuthenticationError, match="Invalid user credentials"):
        run("wrong")
    with pytest.raises(AuthenticationError, match="Invalid user credentials"):
        ScramServer(mech, lambda u, m: None).evaluate(b"n,,n=nobody,r=abc")
    for bad in (b"p=tls-unique,,n=a,r=b", b"garbage", b"n,,r=x", "é".encode("latin-1")):
        with pytest.raises(AuthenticationError):
            ScramServer(mech, lambda u, m: None).evaluate(bad)


def test_plain():
    s = PlainServer({"bob": "pw"})
    assert s.evaluate(b"\0bob\0pw") == b"" and s.user == "bob"
    for bad in (b"\0bob\0nope", b"\0eve\0pw", b"carol\0bob\0pw", b"nonul"):
        with pytest.raises(AuthenticationError):
            PlainServer({"bob": "pw"}).evaluate(bad)


# ---------------------------------------------------------------- the gate
def _frame(body, version: int, cid: int = 7) -> bytes:
    return b"".join(bytes(p) for p in encode_request(body, version, cid, "t"))


def _answer(parts, key: int, version: int):
    return decode_response(b"".join(bytes(p) for p in parts), key, version)[1]


def test_gate_answers_bad_input_and_closes():
    cfg = SaslServerConfig(("PLAIN", "SCRAM-SHA-512"), {"bob": "pw"},
                           scram_lookup=lambda u, m: None)
    # a SASL frame before the handshake: ILLEGAL_SASL_STATE, closed
    a = Authenticator(cfg, "1.2.3.4:5", "SASL_SSL")
    r = _answer(a.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"x"), 2)), 36, 2)
    assert r.error_code == Errors.ILLEGAL_SASL_STATE and a.failed
    # any other API before authentication: closed without an answer
    a = Authenticator(cfg, "1.2.3.4:5", "SASL_SSL")
    assert a.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1)) is not None
    assert a.intercepts(b"\x00\x03") and a.handle(b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x00") is None and a.failed
    # unknown mechanism: UNSUPPORTED_SASL_MECHANISM listing the enabled ones, closed
    a = Authenticator(cfg, "1.2.3.4:5", "SASL_SSL")
    r = _answer(a.handle(_frame(SaslHandshakeRequest(mechanism="GSSAPI"), 1)), 17, 1)
    assert isinstance(r, SaslHandshakeResponse) and r.error_code == Errors.UNSUPPORTED_SASL_MECHANISM
    assert r.mechanisms == ["PLAIN", "SCRAM-SHA-512"] and a.failed
    # wrong password: SASL_AUTHENTICATION_FAILED with a message, closed
    a = Authenticator(cfg, "1.2.3.4:5", "SASL_SSL")
    a.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
    r = _answer(a.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"\0bob\0bad"), 2)), 36, 2)
    assert isinstance(r, SaslAuthenticateResponse) and r.error_code == Errors.SASL_AUTHENTICATION_FAILED
    assert "Invalid username or password" in r.error_message and a.failed
    # right password: authenticated, later requests pass the gate untouched
    a = Authenticator(cfg, "1.2.3.4:5", "SASL_SSL")
    a.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
    r = _answer(a.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"\0bob\0pw"), 1)), 36, 1)
    assert r.error_code == 0 and a.principal == "User:bob" and not a.failed
    assert not a.intercepts(b"\x00\x00rest") and not a.intercepts(b"\x00\x11")  # no re-auth configured


def test_gate_reauthentication():
    cfg = SaslServerConfig(("PLAIN",), {"bob": "pw", "eve": "pw"}, reauth_ms=60_000)
    a = Authenticator(cfg, "p", "L")
    a.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
    r = _answer(a.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"\0bob\0pw"), 1)), 36, 1)
    assert r.session_lifetime_ms == 60_000 and not a.intercepts(b"\x00\x00")
    assert a.intercepts(b"\x00\x11")  # a new handshake: re-authentication
    a.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
    r = _answer(a.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"\0bob\0pw"), 1)), 36, 1)
    assert r.error_code == 0 and not a.failed
    a.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
    r = _answer(a.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"\0eve\0pw"), 1)), 36, 1)
    assert r.error_code == Errors.SASL_AUTHENTICATION_FAILED and "same principal" in r.error_message
    b = Authenticator(cfg, "p", "L")
    b.handle(_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
    b.handle(_frame(SaslAuthenticateRequest(auth_bytes=b"\0bob\0pw"), 1))
    b.expires_at = 1.0  # the session is over: the next request closes the connection
    assert b.intercepts(b"\x00\x00") and b.handle(b"\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00") is None and b.failed


def test_scram_credential_is_salted():
    c = make_credential("SCRAM-SHA-512", "pw")
    assert isinstance(c, ScramCredential) and len(c.salt) == 32 and b"pw" not in c.stored_key + c.server_key
    assert make_credential("SCRAM-SHA-512", "pw").salt != c.salt
