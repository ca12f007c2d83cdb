"""tools/bytecode.py: node processes started where bytecode may not be written into the tree get
a cache outside it (built in process: no nodes)."""

from __future__ import annotations

from pathlib import Path

from tools.bytecode import cache_outside_the_tree


def test_an_environment_forbidding_bytecode_gets_a_cache_outside_the_tree() -> None:
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}
    assert cache_outside_the_tree(env)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PATH"] == "/bin"
    prefix = Path(env["PYTHONPYCACHEPREFIX"])
    assert prefix.is_dir() and not prefix.is_relative_to(Path(__file__).resolve().parent.parent / "tests")


def test_an_environment_with_its_own_choice_is_left_alone() -> None:
    own = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/somewhere"}
    allowed = {"PATH": "/bin"}
    assert not cache_outside_the_tree(own) and own == {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/somewhere"}
    assert not cache_outside_the_tree(allowed) and allowed == {"PATH": "/bin"}
