"""Listener security from server.properties, with Kafka's keys: which protocol each listener
speaks (`listener.security.protocol.map`), its TLS context (`ssl.*`), its SASL mechanisms and
PLAIN users (`sasl.enabled.mechanisms`, JAAS `user_NAME="password"`), and the credentials this
node uses towards its peers.

Fail closed: a listener whose protocol, mechanism or certificate cannot be served raises
ConfigError (one line naming the listener and key), so the process refuses to start instead of
serving it some other way. A key is read per listener first, as Kafka's
`listener.name.<listener, lower case>.<key>`, then globally.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from metadata.acls import Authorizer, parse_super_users
from metadata.image import ScramCredential
from node.config import ConfigError, NodeConfig
from node.scram import PLAIN, SCRAM_MECHANISMS, SUPPORTED_MECHANISMS

# Kafka's SecurityProtocol ids (BrokerRegistration's SecurityProtocol)
PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}
# Kafka's default is GSSAPI, which Strata does not serve; SCRAM needs no configured passwords
DEFAULT_MECHANISMS = "SCRAM-SHA-256,SCRAM-SHA-512"
CLIENT_AUTH = ("none", "requested", "required")
ANONYMOUS = "User:ANONYMOUS"
_JAAS_OPTION = re.compile(r'([A-Za-z0-9_.-]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


# authorizer.class.name values served (Kafka's KRaft authorizer; any of these names enables it)
AUTHORIZERS = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer", "StandardAuthorizer")


def authorizer(cfg: NodeConfig) -> Authorizer | None:
    """`authorizer.class.name` set: ACLs are enforced (fail closed: another class is refused)."""
    name = cfg.props.get("authorizer.class.name", "").strip()
    if not name:
        return None
    if name not in AUTHORIZERS:
        raise ConfigError(f"authorizer.class.name: {name} is not supported (use {AUTHORIZERS[0]})")
    return Authorizer(parse_super_users(cfg.props.get("super.users", "")),
                      cfg.bool("allow.everyone.if.no.acl.found", False))


def protocol_map(cfg: NodeConfig) -> dict[str, str]:
    """listener.security.protocol.map; unset, each protocol's name maps to itself (Kafka's default)."""
    raw = cfg.props.get("listener.security.protocol.map")
    if raw is None:
        return {name: name for name in PROTOCOLS}
    out = {}
    for item in filter(None, (x.strip() for x in raw.split(","))):
        name, sep, proto = item.partition(":")
        if not sep or not name.strip() or proto.strip().upper() not in PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: {item!r} is not LISTENER:"
                              f"{'|'.join(PROTOCOLS)}")
        out[name.strip().upper()] = proto.strip().upper()
    return out


def listener_protocol(cfg: NodeConfig, name: str) -> str:
    mapping = protocol_map(cfg)
    proto = mapping.get(name)
    if proto is None:
        # Kafka (KRaft) maps an unmapped controller listener to PLAINTEXT when the map is not set
        if "listener.security.protocol.map" not in cfg.props and name in cfg.controller_listener_names:
            return "PLAINTEXT"
        raise ConfigError(f"listener {name}: no security protocol for it in listener.security.protocol.map")
    return proto


def listener_prop(cfg: NodeConfig, listener: str, key: str) -> str | None:
    return cfg.props.get(f"listener.name.{listener.lower()}.{key}", cfg.props.get(key))


def parse_jaas(value: str) -> dict[str, str]:
    """The options of a JAAS line (`... required username="a" password="b" user_a="b";`)."""
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS_OPTION.findall(value)}


def jaas_options(cfg: NodeConfig, listener: str, mechanism: str) -> dict[str, str]:
    """Kafka's `listener.name.<l>.<mechanism>.sasl.jaas.config`, else `sasl.jaas.config`."""
    raw = cfg.props.get(f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config")
    if raw is None:
        raw = listener_prop(cfg, listener, "sasl.jaas.config")
    return parse_jaas(raw or "")


@dataclass(frozen=True)
class SaslServerConfig:
    mechanisms: tuple[str, ...]
    plain_users: Mapping[str, str] = field(default_factory=dict)
    reauth_ms: int = 0  # connections.max.reauth.ms (KIP-368); 0: sessions never expire
    # (user, mechanism id) -> credential: the process's metadata image, set when it wires the listener
    scram_lookup: Callable[[str, int], ScramCredential | None] = lambda _u, _m: None


@dataclass(frozen=True)
class ListenerSecurity:
    name: str
    protocol: str
    ssl: ssl.SSLContext | None = None
    sasl: SaslServerConfig | None = None

    @property
    def protocol_id(self) -> int:
        return PROTOCOLS[self.protocol]


def listener_security(cfg: NodeConfig, name: str) -> ListenerSecurity:
    """Everything needed to serve listener `name`; ConfigError when any of it cannot be served."""
    proto = listener_protocol(cfg, name)
    ctx = server_ssl_context(cfg, name) if proto in ("SSL", "SASL_SSL") else None
    sasl = None
    if proto.startswith("SASL_"):
        raw = cfg.props.get(f"listener.name.{name.lower()}.sasl.enabled.mechanisms",
                            cfg.props.get("sasl.enabled.mechanisms", DEFAULT_MECHANISMS))
        mechs = tuple(m.strip().upper() for m in raw.split(",") if m.strip())
        if not mechs:
            raise ConfigError(f"listener {name}: sasl.enabled.mechanisms is empty")
        for m in mechs:
            if m not in SUPPORTED_MECHANISMS:
                raise ConfigError(f"listener {name}: SASL mechanism {m} is not supported "
                                  f"(supported: {', '.join(SUPPORTED_MECHANISMS)})")
        users: dict[str, str] = {}
        if PLAIN in mechs:
            opts = jaas_options(cfg, name, PLAIN)
            users = {k[5:]: v for k, v in opts.items() if k.startswith("user_") and len(k) > 5}
            if not users:
                raise ConfigError(f"listener {name}: PLAIN is enabled but no user_NAME=\"password\" is set in "
                                  f"listener.name.{name.lower()}.plain.sasl.jaas.config")
        reauth = cfg.int("connections.max.reauth.ms", 0)
        if reauth < 0:
            raise ConfigError(f"connections.max.reauth.ms: {reauth} is below 0")
        sasl = SaslServerConfig(mechs, users, reauth)
    return ListenerSecurity(name, proto, ctx, sasl)


def _load_chain(ctx: ssl.SSLContext, where: str, cert: str, key: str | None, password: str | None) -> None:
    try:
        ctx.load_cert_chain(cert, key or None, password)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"{where}: cannot load certificate {cert} / key {key}: {e}") from None


def _load_ca(ctx: ssl.SSLContext, where: str, ca: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"{where}: cannot load ssl.ca.location {ca}: {e}") from None


def server_ssl_context(cfg: NodeConfig, name: str) -> ssl.SSLContext:
    where = f"listener {name}"
    cert = listener_prop(cfg, name, "ssl.certificate.location")
    if not cert:
        raise ConfigError(f"{where}: ssl.certificate.location is required for {listener_protocol(cfg, name)}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, where, cert, listener_prop(cfg, name, "ssl.key.location"),
                listener_prop(cfg, name, "ssl.key.password"))
    auth = (listener_prop(cfg, name, "ssl.client.auth") or "none").lower()
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"{where}: ssl.client.auth={auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    ca = listener_prop(cfg, name, "ssl.ca.location")
    if ca:
        _load_ca(ctx, where, ca)
    if auth != "none":
        if not ca:
            raise ConfigError(f"{where}: ssl.client.auth={auth} needs ssl.ca.location")
        ctx.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
    return ctx


@dataclass(frozen=True)
class ClientSecurity:
    """How a client connection authenticates: TLS context and/or SASL credentials."""

    protocol: str = "PLAINTEXT"
    ssl: ssl.SSLContext | None = None
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    check_hostname: bool = True

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


PLAINTEXT_CLIENT = ClientSecurity()


def client_ssl_context(where: str, ca: str | None, cert: str | None, key: str | None, password: str | None,
                       check_hostname: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if ca:
        _load_ca(ctx, where, ca)
    else:
        ctx.load_default_certs()
    if cert:
        _load_chain(ctx, where, cert, key, password)
    return ctx


def client_security(protocol: str, get: Callable[[str], str | None], where: str,
                    mechanism: str | None, jaas: dict[str, str]) -> ClientSecurity:
    """A ClientSecurity from Kafka's client keys read through `get` (ConfigError when unusable)."""
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{where}: security.protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    check_hostname = (get("ssl.endpoint.identification.algorithm") or "https").lower() == "https"
    ctx = None
    if protocol in ("SSL", "SASL_SSL"):
        ctx = client_ssl_context(where, get("ssl.ca.location"), get("ssl.certificate.location"),
                                 get("ssl.key.location"), get("ssl.key.password"), check_hostname)
    if not protocol.startswith("SASL_"):
        return ClientSecurity(protocol, ctx, check_hostname=check_hostname)
    mechanism = (mechanism or PLAIN).upper()
    if mechanism not in SUPPORTED_MECHANISMS:
        raise ConfigError(f"{where}: SASL mechanism {mechanism} is not supported")
    user = get("sasl.username") or jaas.get("username")
    password = get("sasl.password") or jaas.get("password")
    if not user or password is None:
        raise ConfigError(f"{where}: SASL {mechanism} needs username and password (sasl.jaas.config)")
    return ClientSecurity(protocol, ctx, mechanism, user, password, check_hostname)


def node_client_security(cfg: NodeConfig, listener: str, mechanism_key: str) -> ClientSecurity:
    """How this node connects to `listener` of its peers (the inter-broker or the controller
    listener), with its own credentials from its config."""
    proto = listener_protocol(cfg, listener)
    mechanism = None
    if proto.startswith("SASL_"):
        mechanism = cfg.props.get(mechanism_key)
        if mechanism is None:
            enabled = listener_prop(cfg, listener, "sasl.enabled.mechanisms") or DEFAULT_MECHANISMS
            mechanism = enabled.split(",")[0].strip()
    jaas = jaas_options(cfg, listener, mechanism) if mechanism else {}
    return client_security(proto, lambda key: listener_prop(cfg, listener, key), f"listener {listener} ({mechanism_key})",
                           mechanism, jaas)


def properties_client_security(props: Mapping[str, str], where: str) -> ClientSecurity:
    """A client.properties file's settings (the tools' --command-config), Kafka's client keys."""
    return client_security((props.get("security.protocol") or "PLAINTEXT").upper(), props.get, where,
                           props.get("sasl.mechanism"), parse_jaas(props.get("sasl.jaas.config", "")))


__all__ = ["ANONYMOUS", "PROTOCOLS", "SCRAM_MECHANISMS", "ClientSecurity", "ListenerSecurity", "SaslServerConfig"]
