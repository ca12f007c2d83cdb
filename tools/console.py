"""What kafka-console-producer.sh and kafka-console-consumer.sh share: Kafka's KEY=VALUE options
(--property, --producer-property, --consumer-property) and Java properties files (--producer.config,
--consumer.config, --reader-config, --formatter-config)."""

from __future__ import annotations

import argparse
import codecs

from tools.admin import AdminError


def key_value(value: str) -> tuple[str, str]:
    """An argparse type: KEY=VALUE (the value may hold '=' and be empty)."""
    k, sep, v = value.partition("=")
    if not sep or not k.strip():
        raise argparse.ArgumentTypeError(f"{value[:60]!r} is not KEY=VALUE")
    return k.strip(), v


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file: KEY=VALUE or KEY: VALUE lines, # and ! comments, backslash escapes
    (a line ending in a backslash goes on with the next)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise AdminError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise AdminError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.lstrip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        k, v = (line[:cut], line[cut + 1:]) if cut >= 0 else (line, "")
        out[unescape(k.strip())] = unescape(v.lstrip())
    return out


def unescape(s: str) -> str:
    """Java's escapes in properties and separator options (``\\t``, ``\\n``, ``\\u0001``)."""
    if "\\" not in s:
        return s
    try:
        return codecs.decode(s, "unicode_escape")
    except UnicodeDecodeError:
        return s


def is_true(props: dict[str, str], key: str, default: bool = False) -> bool:
    v = props.get(key)
    return default if v is None else v.strip().lower() == "true"


def merged(file_props: dict[str, str], pairs: list[tuple[str, str]]) -> dict[str, str]:
    """A properties file, overridden by KEY=VALUE options (Kafka's precedence)."""
    out = dict(file_props)
    out.update(pairs)
    return out


def int_prop(props: dict[str, str], key: str, default: int, lo: int = 0, hi: int = 2**31 - 1) -> int:
    v = props.get(key)
    if v is None:
        return default
    try:
        n = int(v.strip())
    except ValueError:
        raise AdminError(f"{key}={v[:40]!r} is not an integer") from None
    if not lo <= n <= hi:
        raise AdminError(f"{key}={n} is out of range ({lo}..{hi})")
    return n
