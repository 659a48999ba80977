"""How eqopt is built: what runs for `update` is visible where it is defined.

The type checks are decorators on what the user calls (`@checked`,
`@init_entry`, `@update_entry`), nothing rewrites eqopt's source or wraps its
classes behind the reader's back, capabilities are read as properties, and a
user's process (no test hook) checks the public boundary with short
tracebacks (docs/development.md, "Type checking" and "Anatomy of an update").
"""

import inspect
import pathlib
import re
import subprocess
import sys
import textwrap
import types
import warnings

import eqopt
from eqopt._base import AbstractGradientTransformation

PACKAGE = pathlib.Path(eqopt.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

CAPABILITIES = (
    "elementwise",
    "runs_on_buffers",
    "handles_packed",
    "params_like_updates",
    "per_example_updates",
    "advises_bucketing",
    "freezes",
    "frozen_selection",
)


def test_capabilities_are_read_directly():
    probe = re.compile(r"getattr\([^)]*[\"'](" + "|".join(CAPABILITIES) + r")[\"']")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in SOURCES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if probe.search(line)
    ]
    assert found == []


def test_capabilities_are_documented_on_the_protocol():
    for name in CAPABILITIES:
        assert hasattr(AbstractGradientTransformation, name), name
    page = (PACKAGE.parent / "docs" / "development.md").read_text()
    for name in CAPABILITIES:
        assert f"| `{name}" in page, f"{name} has no row in 'Capabilities'"


def test_no_thread_local_flags_and_no_wrapping_in_init_subclass():
    for path in SOURCES:
        assert "threading.local" not in path.read_text(), path
    for cls in [AbstractGradientTransformation, *_transform_classes()]:
        assert "__init_subclass__" not in cls.__dict__, cls
    assert not (PACKAGE / "_hook.py").exists()


def test_backend_dependent_choices_live_in_one_module():
    found = [
        str(path.relative_to(PACKAGE))
        for path in SOURCES
        if "default_backend()" in path.read_text() and path.name != "_backend.py"
    ]
    assert found == [], "put the choice in eqopt/_backend.py, with its reason"


def test_lapack_decompositions_go_through_the_per_slice_helpers():
    """A per-layer step vmapped over a stack must call LAPACK one slice at a
    time on the CPU (docs/development.md, "Decompositions in a per-layer step")."""
    pattern = re.compile(
        r"jnp\.linalg\.(eigh|qr|svd|cholesky|inv|solve|eig)\(|linalg\.triangular_solve\("
    )
    found = [
        f"{path.relative_to(PACKAGE)}: {match.group(0)}"
        for path in SOURCES
        if path.name != "_linalg.py"
        for match in pattern.finditer(path.read_text())
    ]
    assert found == [], "use eqopt/_linalg.py's eigh, qr, thin_svd or solve_upper_right"


def _transform_classes() -> list[type]:
    seen: set[type] = set()
    stack = [AbstractGradientTransformation]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen and sub.__module__.startswith("eqopt"):
                seen.add(sub)
                stack.append(sub)
    return sorted(seen, key=lambda c: (c.__module__, c.__qualname__))


def test_every_transform_method_is_an_entry():
    # Import every module, so every transform class exists.
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages([str(PACKAGE)], "eqopt."):
        importlib.import_module(module.name)
    missing = []
    for cls in _transform_classes():
        for name in ("init", "update"):
            method = cls.__dict__.get(name)
            if method is None or getattr(method, "__isabstractmethod__", False):
                continue
            if getattr(method, "__eqopt_entry__", None) != name:
                missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert missing == [], "decorate with @init_entry / @update_entry"
    assert len(_transform_classes()) > 90


def _public_objects():
    # Every public object of eqopt's namespaces (microbatching's too) that
    # eqopt defines.
    from test_api import _modules, _public

    modules = [*_modules(), ("microbatching", eqopt.microbatching)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for namespace, module in modules:
            for name, obj in _public(module).items():
                if getattr(obj, "__module__", "").startswith("eqopt"):
                    yield f"{namespace}.{name}", obj


def test_every_public_function_and_final_class_is_checked():
    missing = []
    for name, obj in _public_objects():
        if isinstance(obj, type):
            if (
                inspect.isabstract(obj)
                or obj.__name__.startswith("Abstract")
                or issubclass(obj, BaseException)
                or not hasattr(obj, "__dataclass_fields__")
            ):
                continue
        elif not isinstance(obj, types.FunctionType):
            continue
        if not getattr(obj, "__eqopt_checked__", False):
            missing.append(name)
    assert missing == [], "decorate with @checked where it is defined"


def _run(code: str) -> subprocess.CompletedProcess:
    # A fresh interpreter: eqopt as a user imports it, without the tests' hook.
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )


def test_a_users_process_checks_the_boundary_with_a_short_traceback():
    out = _run(
        """
        import sys, traceback
        import jax.numpy as jnp
        import eqopt

        print([type(f).__module__ for f in sys.meta_path if "eqopt" in repr(type(f))])
        try:
            eqopt.adam(learning_rate="fast")
        except eqopt.ArgumentTypeError as error:
            print("constructor:", error)
        opt = eqopt.adam(1e-3)
        params = {"w": jnp.ones((3, 2))}
        state = opt.init(params)
        try:
            opt.update({"w": jnp.ones((2, 3))}, state, params)
        except ValueError as error:
            text = "".join(traceback.format_exception(error))
            frames = [f for f in traceback.extract_tb(error.__traceback__)]
            inside = [f for f in frames if "/eqopt/" in f.filename]
            print("lines:", len(text.splitlines()), "eqopt frames:", len(inside))
            print("message:", error)
        try:
            opt.update("not gradients", state, params)
        except eqopt.ArgumentTypeError as error:
            print("update:", error)
        # An optimiser wrapped for Optax's protocol passes on the user's call:
        # it is checked as the user's.
        wrapped = eqopt.to_optax(opt)
        try:
            wrapped.update({"w": jnp.ones((2, 3))}, wrapped.init(params), params)
        except ValueError as error:
            print("to_optax:", error)
        """
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[]"
    assert lines[1].startswith("constructor: ") and "learning_rate" in lines[1]
    counts = re.match(r"lines: (\d+) eqopt frames: (\d+)", lines[2])
    assert counts, lines[2]
    assert int(counts.group(1)) <= 20 and int(counts.group(2)) <= 3
    assert "['w']" in lines[3] and "(2, 3)" in lines[3] and "(3, 2)" in lines[3]
    assert lines[4].startswith("update: ") and "updates" in lines[4]
    assert lines[5].startswith("to_optax: ") and "['w']" in lines[5], lines[5]
