"""The kafka-*.sh tools never print a traceback for bad input.

A port out of range, numbers no Kafka field can hold (on the command line or in a JSON file),
deeply nested JSON and numbers of thousands of digits each give exactly one line on stderr and a
non-zero exit: 2 for a bad argument (argparse's usage error, on one line), 1 for a bad file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import installed_script
from tools.cluster import free_ports

TOPICS = installed_script("kafka-topics.sh")
REASSIGN = installed_script("kafka-reassign-partitions.sh")
CHUNKS = installed_script("kafka-chunks.sh")


@pytest.fixture(scope="module")
def nowhere() -> str:
    return f"127.0.0.1:{free_ports(1)[0]}"


def one_line(args: list[str], code: int, needle: str) -> str:
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1, f"expected one line, got {len(lines)}: {r.stderr[:2000]!r}"
    assert needle in lines[0], lines[0]
    assert len(lines[0]) < 400, "the line quotes the input whole"
    return lines[0]


@pytest.mark.parametrize("port", ["0", "65536", "99999", "9" * 60, "-1"])
def test_port_out_of_range(port: str) -> None:
    bs = f"127.0.0.1:{port}"
    need = "out of range" if port.isdigit() else "is not HOST:PORT"
    one_line([TOPICS, "--bootstrap-server", bs, "--list"], 2, need)
    one_line([REASSIGN, "--bootstrap-server", bs, "--list"], 2, need)
    one_line([CHUNKS, "--bootstrap-server", bs, "create", "--create-chunk-json-file", "x.json"], 2, need)


@pytest.mark.parametrize(
    "args",
    [
        ["--create", "--topic", "t", "--partitions", str(2**31)],
        ["--create", "--topic", "t", "--partitions", "-" + str(2**31 + 1)],
        ["--create", "--topic", "t", "--partitions", "9" * 5000],
        ["--create", "--topic", "t", "--replication-factor", str(2**15)],
        ["--create", "--topic", "t", "--replica-assignment", f"1:{2**31}"],
        ["--alter", "--topic", "t", "--partitions", str(2**40)],
    ],
)
def test_numbers_out_of_range_on_the_command_line(nowhere: str, args: list[str]) -> None:
    line = one_line([TOPICS, "--bootstrap-server", nowhere, *args], 2, "error: argument")
    assert "out of range" in line or "is not an integer" in line, line


def test_reassign_numbers_out_of_range_on_the_command_line(nowhere: str, tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1]}]}')
    base = [REASSIGN, "--bootstrap-server", nowhere]
    one_line([*base, "--execute", "--reassignment-json-file", str(f), "--throttle", str(2**63)], 2, "out of range")
    one_line([*base, "--generate", "--topics-to-move-json-file", str(f), "--broker-list", f"1,{2**31}"], 2,
             "out of range")


def bad_files(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (file text, what the line says)."""
    deep = "[" * 100_000 + "]" * 100_000
    deep_obj = '{"a":' * 50_000 + "1" + "}" * 50_000
    digits = "9" * 5000
    return {
        "deep-array": (deep, "nested too deeply"),
        "deep-object": (deep_obj, "nested too deeply"),
        "digits": ('{"version":1,"partitions":[{"topic":"t","partition":' + digits + ',"replicas":[1]}]}',
                   "number too large"),
        "int64": ('{"version":1,"x":' + str(2**63) + ',"partitions":[{"topic":"t","partition":0,"replicas":[1]}]}',
                  "out of range"),
        "partition": ('{"version":1,"partitions":[{"topic":"t","partition":' + str(2**31) + ',"replicas":[1]}]}',
                      '"partition" number from 0 to 2147483647'),
        "float": ('{"version":1,"partitions":[{"topic":"t","partition":1e400,"replicas":[1]}]}', '"partition"'),
    }


def test_bad_json_files_of_every_tool(nowhere: str, tmp_path: Path) -> None:
    for name, (text, needle) in bad_files(tmp_path).items():
        f = tmp_path / f"{name}.json"
        f.write_text(text)
        one_line([REASSIGN, "--bootstrap-server", nowhere, "--execute", "--reassignment-json-file", str(f)], 1, needle)
        one_line([CHUNKS, "--bootstrap-server", nowhere, "create", "--create-chunk-json-file", str(f)], 1, needle)
        if name.startswith("deep") or name == "digits":
            one_line([REASSIGN, "--bootstrap-server", nowhere, "--generate", "--topics-to-move-json-file", str(f),
                      "--broker-list", "1"], 1, needle)
    big_replica = tmp_path / "replica.json"
    big_replica.write_text('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,' + str(2**31) + "]}]}")
    one_line([REASSIGN, "--bootstrap-server", nowhere, "--execute", "--reassignment-json-file", str(big_replica)], 1,
             '"replicas"')
    one_line([CHUNKS, "--bootstrap-server", nowhere, "create", "--create-chunk-json-file", str(big_replica)], 1,
             '"replicas"')
    big_start = tmp_path / "start.json"
    big_start.write_text('{"chunks":[{"topic":"t","partition":0,"startOffset":' + str(2**63) + ',"replicas":[1]}]}')
    one_line([CHUNKS, "--bootstrap-server", nowhere, "alter", "--alter-chunk-json-file", str(big_start)], 1,
             "out of range")
