"""The type checker of the import hook (`eqopt/_typecheck.py`): lazy beartype, one-line errors."""

import inspect
import pathlib

import jax.numpy as jnp
import jaxtyping
import pytest
from jaxtyping import Array, Float

import eqopt
from eqopt._typecheck import (
    ArgumentTypeError,
    _expected,
    _owner,
    _split_top_level,
    typechecker,
)


def test_argument_type_error_is_a_type_error_and_a_jaxtyping_error():
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ArgumentTypeError, jaxtyping.TypeCheckError)
    assert eqopt.ArgumentTypeError is ArgumentTypeError


def test_checks_build_on_first_call_and_pass_results_through():
    calls = []

    def scale(x: Float[Array, ""], factor: float = 2.0) -> Float[Array, ""]:
        calls.append(x)
        return x * factor

    checked = typechecker(scale)
    assert checked.__name__ == "scale" and checked.__wrapped__ is scale
    assert float(checked(jnp.asarray(1.5))) == 3.0
    assert len(calls) == 1


def scale(x: Float[Array, ""], factor: float = 2.0) -> Float[Array, ""]:
    return x * factor


def test_a_failed_check_is_one_line_naming_argument_expected_and_got():
    checked = jaxtyping.jaxtyped(typechecker=typechecker)(scale)
    with pytest.raises(ArgumentTypeError) as info:
        checked(jnp.asarray(1.0), factor="two")
    message = str(info.value)
    assert "\n" not in message
    assert message == "scale: argument `factor` must be float, got str 'two'."
    with pytest.raises(ArgumentTypeError, match=r"got an array float32\[3\]"):
        checked(jnp.ones(3))


def test_an_annotation_that_explains_names_the_leaf():
    # `Updates` says which leaf is wrong, by path.
    opt = eqopt.sgd(0.1)
    params = {"w": jnp.ones(2)}
    state = opt.init(params)
    with pytest.raises(
        ArgumentTypeError, match=r"the leaf at \['w'\] is an array of dtype int32"
    ):
        opt.update({"w": jnp.ones(2, jnp.int32)}, state, params)


def test_a_state_of_another_transform_gets_a_hint():
    params = {"w": jnp.ones(2)}
    adam_state = eqopt.scale_by_adam().init(params)
    with pytest.raises(
        ArgumentTypeError, match="looks like the state of `scale_by_adam`"
    ):
        eqopt.scale_by_lion().update(params, adam_state)


def test_expected_types_read_as_written():
    assert _expected(int) == "int"
    assert _expected(inspect.Parameter.empty) == "?"
    assert _expected(Float[Array, ""]) == 'Float[Array, ""]'
    assert _expected(int | None) == "int | None"
    assert _split_top_level("a, b[c, d], e") == ["a", " b[c, d]", " e"]


def test_owner_names_the_class_of_a_constructor():
    class Thing:
        def __init__(self):
            pass

        def method(self):
            pass

    assert _owner(Thing.__init__) == (
        "test_owner_names_the_class_of_a_constructor.Thing"
    )
    assert _owner(Thing.method).endswith("Thing.method")


def test_tests_use_the_checker_that_ships():
    # jaxtyping's own import hook would check eqopt's modules with another
    # checker than `eqopt/_hook.py` installs (and build its wrappers eagerly).
    tests = pathlib.Path(__file__).parent
    hook = "install_" + "import_hook"  # not this file's own mention
    users = [p.name for p in sorted(tests.glob("*.py")) if hook in p.read_text()]
    assert users == []


@pytest.mark.parametrize(
    "call",
    [
        lambda: eqopt.assignment.hungarian_algorithm("cost"),
        lambda: eqopt.second_order.hvp(1, "params", "v", "x", "y"),
        lambda: eqopt.projections.projection_simplex(jnp.ones(3), scale="x"),
        lambda: eqopt.power_iteration(jnp.ones((2, 2)), num_iters="x"),
    ],
    ids=["assignment", "second_order", "projections", "linalg"],
)
def test_namespaces_are_checked_by_eqopts_checker(call):
    with pytest.raises(ArgumentTypeError):
        call()
