"""The checking import hook (`eqopt/_hook.py`): the rewriting, the cache and its tag."""

import hashlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap
import types

import pytest

import eqopt
from eqopt import _hook

SOURCE = '''
"""A made-up module of eqopt, loaded through the hook."""

from typing import no_type_check


def double(x: int) -> int:
    return 2 * x


@no_type_check
def unchecked(x: int) -> int:
    return x


def asserts() -> str:
    assert False, "asserts are kept"
    return "asserts are stripped"


def outer(x: int):
    def plain(y):  # a closure with no annotations: left undecorated
        return y

    def annotated(y: int) -> int:
        return y

    return plain, annotated


def top_level_plain(y):
    return y
'''


def _loader(path: pathlib.Path) -> _hook._CheckingLoader:
    return _hook._CheckingLoader("eqopt._made_up", str(path))


def _load(loader: _hook._CheckingLoader) -> types.ModuleType:
    module = types.ModuleType("eqopt._made_up")
    module.__file__ = loader.path
    exec(loader.get_code("eqopt._made_up"), module.__dict__)
    return module


@pytest.fixture
def source(tmp_path, monkeypatch):
    # The caching is what is tested, whatever PYTHONDONTWRITEBYTECODE says.
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = tmp_path / "made_up.py"
    path.write_text(SOURCE, encoding="utf-8")
    return path


def _cache(path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(
        importlib.util.cache_from_source(str(path), optimization=_hook._CACHE_TAG)
    )


def test_rewritten_functions_are_checked_unless_marked(source):
    module = _load(_loader(source))
    assert module.double(2) == 4
    with pytest.raises(eqopt.ArgumentTypeError, match="argument `x` must be int"):
        module.double("2")
    assert module.unchecked("2") == "2"


def test_closures_without_annotations_are_not_wrapped(source):
    """A closure with nothing to check (the per-leaf helpers of `update`) is not
    wrapped, so tracing a model of many leaves does not pay a wrapper per leaf;
    an annotated closure and a top-level function still are."""
    module = _load(_loader(source))
    plain, annotated = module.outer(1)
    assert not hasattr(plain, "__wrapped__")
    assert hasattr(annotated, "__wrapped__")
    with pytest.raises(eqopt.ArgumentTypeError, match="argument `y` must be int"):
        annotated("1")
    assert hasattr(module.top_level_plain, "__wrapped__")


def test_cache_hit_skips_the_rewriting(source, monkeypatch):
    _load(_loader(source))
    assert _cache(source).exists()

    def fail(*args, **kwargs):
        raise AssertionError("rewrote a module whose cache is fresh")

    monkeypatch.setattr(_hook._CheckingLoader, "source_to_code", fail)
    assert _load(_loader(source)).double(3) == 6


def test_stale_source_is_rewritten_again(source):
    _load(_loader(source))
    before = _cache(source).read_bytes()
    source.write_text(SOURCE.replace("2 * x", "3 * x + 0"), encoding="utf-8")
    stat = source.stat()
    os.utime(source, (stat.st_atime, stat.st_mtime + 10))
    assert _load(_loader(source)).double(2) == 6
    assert _cache(source).read_bytes() != before


def test_no_cache_written_when_bytecode_is_off(source, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert _load(_loader(source)).double(2) == 4
    assert not _cache(source).exists()


def test_read_only_directory_compiles_each_time(source, monkeypatch):
    # As root, `chmod` does not stop a write, so the write fails as it does on a
    # read-only file system.
    def refuse(self, path, data, *args, **kwargs):
        raise PermissionError(30, "Read-only file system", path)

    monkeypatch.setattr(_hook._CheckingLoader, "set_data", refuse)
    assert _load(_loader(source)).double(2) == 4
    assert not _cache(source).exists()


def test_cache_tag_follows_the_hook_source_and_the_optimisation_level():
    digest = hashlib.sha256(pathlib.Path(_hook.__file__).read_bytes()).hexdigest()
    assert _hook._CACHE_TAG == f"eqoptcheck{digest[:16]}opt{sys.flags.optimize}"
    assert _hook._CACHE_TAG.isalnum()  # what `cache_from_source` accepts


def test_python_dash_o_never_shares_bytecode_with_python(source):
    # `-O` strips asserts: a cache written under it must not be loaded without
    # it, nor the other way round.
    code = textwrap.dedent(
        f"""
        import types
        from eqopt import _hook

        loader = _hook._CheckingLoader("eqopt._made_up", {str(source)!r})
        module = types.ModuleType("eqopt._made_up")
        exec(loader.get_code("eqopt._made_up"), module.__dict__)
        print(_hook._CACHE_TAG, module.asserts())
        """
    )
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(eqopt.__file__).parents[1]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    result = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    tag, outcome = result.stdout.split(maxsplit=1)
    assert outcome.strip() == "asserts are stripped"
    assert tag.endswith("opt1") and tag != _hook._CACHE_TAG
    assert (
        _cache(source).with_name(_cache(source).name.replace("opt0", "opt1")).exists()
    )
    module = _load(_loader(source))  # this interpreter runs without -O
    with pytest.raises(AssertionError, match="asserts are kept"):
        module.asserts()
