"""`import eqopt` stays light: no type checker, no JAX backend, no research namespaces.

The time itself is measured by `benchmarks/import_time.py` (timings do not belong
in tests); these tests pin the causes of a slow import, each in a fresh
interpreter.
"""

import subprocess
import sys
import textwrap

from test_api_pages import NAMESPACES


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_does_no_work_it_can_defer():
    out = _run(
        """
        import sys
        import eqopt
        from jax._src import xla_bridge

        print("beartype" in sys.modules)
        print(bool(xla_bridge._backends))
        lazy = ("eqopt.contrib", "eqopt.losses", "eqopt.projections")
        print(sorted(m for m in sys.modules if m.startswith(lazy)))
        """
    )
    beartype, backend, contrib = out.splitlines()
    assert beartype == "False", "a type check ran while eqopt was imported"
    assert backend == "False", "JAX's backend was initialised while eqopt was imported"
    assert contrib == "[]"


def test_optax_top_level_loss_names_load_the_losses():
    out = _run(
        """
        import eqopt

        print(eqopt.l2_loss is eqopt.losses.l2_loss, "l2_loss" in dir(eqopt))
        """
    )
    assert out.split() == ["True", "True"]


def test_lazy_namespaces_are_checked_however_imported():
    out = _run(
        """
        import eqopt
        from eqopt.contrib import muon
        import eqopt.projections as projections
        import jax.numpy as jnp

        for call in (
            lambda: muon(learning_rate="x"),
            lambda: eqopt.perturbations.make_perturbed_fun(fun=1, num_samples="x"),
            lambda: projections.projection_simplex(jnp.ones(3), scale="x"),
        ):
            try:
                call()
            except TypeError as error:
                print(type(error).__name__)
        lazy = {"assignment", "contrib", "losses", "microbatching", "perturbations"}
        print(sorted(lazy - set(dir(eqopt))))
        """
    )
    assert out.splitlines() == ["ArgumentTypeError"] * 3 + ["[]"]


def test_every_public_name_loads_on_first_use():
    """`import eqopt` imports none of its families; a name loads what it needs, once."""
    out = _run(
        """
        import sys
        import eqopt

        def loaded():
            return {m for m in sys.modules if m.startswith("eqopt.")}

        print(sorted(loaded()))
        print([type(f).__module__ for f in sys.meta_path if "eqopt" in type(f).__module__])
        adam = eqopt.adam
        print("eqopt._alias" in loaded(), "eqopt.contrib" in loaded())
        print(eqopt.adam is adam is eqopt._alias.adam, "adam" in vars(eqopt))
        print(eqopt.tree_map_params is eqopt.tree.map_params)
        namespace = {}
        exec("from eqopt import *", namespace)
        print(namespace["lion"] is eqopt.lion, "ScaleByAdamState" in eqopt.__all__)
        print(isinstance(eqopt.__version__, str))
        try:
            eqopt.no_such_name
        except AttributeError as error:
            print(error)
        """
    )
    lines = out.splitlines()
    assert lines[0] == "['eqopt._typecheck']"
    assert lines[1] == "[]", "`import eqopt` installs no import hook"
    assert lines[2:6] == ["True False", "True True", "True", "True True"]
    assert lines[6] == "True"
    assert lines[7] == "module 'eqopt' has no attribute 'no_such_name'"


def test_the_export_table_is_what_the_type_checkers_read():
    """`eqopt/_exports.py` (read at run time) names what the `TYPE_CHECKING` imports name."""
    import ast
    import pathlib

    import eqopt

    source = pathlib.Path(eqopt.__file__).read_text()
    block = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "_TYPE_CHECKING"
    )
    static = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names:
            module = "eqopt" + ("." + node.module if node.module else "")
            where = (
                (module, alias.name)
                if node.module
                else (module + "." + alias.name, None)
            )
            static[alias.asname or alias.name] = where
    assert static == eqopt._table()


def test_every_name_in_the_table_exists():
    import eqopt

    names = eqopt.__all__
    assert len(names) > 300
    missing = [name for name in names if not hasattr(eqopt, name)]
    assert missing == []


def test_every_public_name_works_as_the_first_thing_touched():
    """Each public name of `eqopt` and of its namespaces, read first after `import eqopt`.

    Which name is read first decides the order in which eqopt's modules are
    imported, and an import cycle shows only in some orders
    (`eqopt.inject_hyperparams` once failed unless `eqopt.schedules` had been
    loaded). One interpreter, with every `eqopt` module removed from
    `sys.modules` before each first touch. Names that live in the same module
    share one fresh start (the first of them decides the import order; the
    others are then read from the loaded module): about 150 fresh imports of
    eqopt for about 550 names.
    """
    out = _run(
        f"""
        import importlib
        import sys

        NAMESPACES = {NAMESPACES!r}


        def fresh():
            for name in [m for m in sys.modules if m.split(".")[0] == "eqopt"]:
                del sys.modules[name]
            return importlib.import_module("eqopt")


        eqopt = fresh()
        groups = {{}}
        for name in eqopt.__all__:
            module = eqopt._table()[name][0]
            groups.setdefault(("eqopt", module), []).append(("eqopt", name))
        for namespace in NAMESPACES:
            module = getattr(eqopt, namespace)
            for name in dir(module):
                if name.startswith("_"):
                    continue
                home = getattr(getattr(module, name), "__module__", None) or namespace
                groups.setdefault((namespace, home), []).append((namespace, name))
        count = 0
        failures = []
        for names in groups.values():
            eqopt = fresh()
            for namespace, name in names:
                try:
                    owner = eqopt if namespace == "eqopt" else getattr(eqopt, namespace)
                    getattr(owner, name)
                except Exception as error:
                    failures.append(f"{{namespace}}.{{name}}: {{type(error).__name__}}: {{error}}")
                count += 1
        print(count, len(groups))
        print("\\n".join(failures))
        """
    )
    first, *failures = out.splitlines()
    count, fresh_starts = map(int, first.split())
    assert [f for f in failures if f] == []
    assert count > 500 and fresh_starts > 50
