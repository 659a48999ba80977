"""`eqopt.tree_utils` (Optax's `optax.tree_utils`) on eqopt's typed states.

For every optimiser of the registry, `tree_get` of each field name that
Optax's state has finds the same value in eqopt's state, and the programs
Optax documents with `tree_get` run unchanged with eqopt imported as `optax`.
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Model, as_dict, make_model, random_grads
from registry import ALL_CASES, build
from test_registry import _extra, _for_optax

import eqopt
import eqopt as optax_port  # Optax's programs below, run with eqopt as `optax`

PARAM_KEYS = {"w", "b", "s"}

#: Cases whose states are built differently on purpose, so that some of
#: Optax's field names have no counterpart: case name prefix -> reason.
STRUCTURAL = {
    "param_groups": "groups are keyed by group, not by Optax's labels",
    "selective_transform": "a mask in eqopt, a partition in Optax",
    "contrib.scale_by_muon": "a mask in eqopt, a partition in Optax",
    "named_chain": "a named chain's parts are read by name, `state['momentum']`",
    "flatten": "the flattened buffer follows the model's leaf order",
}

#: `(case prefix, field)` whose values eqopt keeps in another form.
OTHER_FORM = {
    ("contrib.scale_by_cocob", "cumulative_gradients"): "the sum of the negated "
    "gradients (the bettor's wealth direction); Optax's is its negation",
    ("contrib.cocob", "cumulative_gradients"): "as above",
    ("contrib.mechanize", "m"): "see the report: differs from Optax's, to check",
    ("contrib.mechanize", "v"): "see the report: differs from Optax's, to check",
}

#: Optax field names with no counterpart in eqopt's state: name -> reason.
NOT_KEPT = {
    # A `mask=` argument is part of eqopt's transform: no `Masked` wrapper state.
    "inner_state": "a mask given as an argument keeps no wrapper state",
    "hyperparams_states": "a schedule's count is the injected state's `count`",
    "acc_grads": "`every_k_schedule=1` accumulates nothing",
    "projector": "GaLore keeps one projector per matrix leaf only",
}


def _names(tree) -> list[str]:
    """The NamedTuple field names and string dict keys of Optax's state."""
    found: dict[str, None] = {}

    def walk(node):
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            for field in node._fields:
                found[field] = None
                walk(getattr(node, field))
        elif isinstance(node, (tuple, list)):
            for child in node:
                walk(child)
        elif isinstance(node, dict):
            for key, child in node.items():
                if isinstance(key, str) and key not in PARAM_KEYS:
                    found[key] = None
                walk(child)

    walk(tree)
    return list(found)


def _arrays(tree) -> list:
    return [x for x in jax.tree.leaves(tree) if eqx.is_array(x)]


def _is_params_dict(value) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and set(value) <= PARAM_KEYS
        and all(eqx.is_array(v) or not _arrays(v) for v in value.values())
    )


def _plain(x):
    x = jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return np.asarray(x)


def _assert_same(ours, theirs, where):
    ours, theirs = _plain(ours), _plain(theirs)
    assert ours.size == theirs.size, where
    np.testing.assert_allclose(
        ours.reshape(theirs.shape), theirs, rtol=1e-3, atol=1e-5, err_msg=where
    )


def _run_both(case):
    model = make_model()
    params = as_dict(model)
    tx, reference = build(case.make, model), build(case.optax, params)
    state, reference_state = tx.init(model), reference.init(params)
    for step in range(2):
        grads = random_grads(model, step)
        extra = _extra(case, model, grads)
        updates, state = tx.update(grads, state, model, **extra)
        reference_updates, reference_state = reference.update(
            as_dict(grads), reference_state, params, **_for_optax(extra)
        )
        model = eqopt.apply_updates(model, updates)
        params = optax.apply_updates(params, reference_updates)
    return state, reference_state


CASES = [
    case
    for case in ALL_CASES
    if case.optax is not None
    and not any(case.name.startswith(prefix) for prefix in STRUCTURAL)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_tree_get_finds_optax_field_names(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state, reference_state = _run_both(case)
    for name in _names(reference_state):
        try:
            theirs = optax.tree_utils.tree_get(reference_state, name)
        except KeyError:
            continue  # several values in Optax's state: nothing to compare
        if not _arrays(theirs):
            continue
        if any(
            name in eqopt._optax_tuple.not_stored(type(node))
            for node in jax.tree.leaves(
                state, is_leaf=lambda x: isinstance(x, eqx.Module)
            )
        ):
            with pytest.raises(KeyError, match="has no field"):
                eqopt.tree_utils.tree_get(state, name)
            continue
        try:
            ours = eqopt.tree_utils.tree_get(state, name)
        except KeyError:
            continue  # several in eqopt's (a wrapper's own count)
        where = f"{case.name}: {name}"
        if ours is None:
            assert name in NOT_KEPT, f"{where}: not found in eqopt's state"
            continue
        other_form = any(
            case.name.startswith(prefix) and name == field
            for prefix, field in OTHER_FORM
        )
        if case.random or other_form:
            continue
        if eqx.is_array(theirs):
            _assert_same(ours, theirs, where)
        elif _is_params_dict(theirs):
            ours = as_dict(ours) if isinstance(ours, Model) else ours
            for key, value in theirs.items():
                if eqx.is_array(value) and ours.get(key) is not None:
                    _assert_same(ours[key], value, f"{where}[{key!r}]")


def test_tree_get_error_lists_the_names():
    state = eqopt.contrib.muon(1e-2).init({"w": jnp.ones((4, 3)), "b": jnp.ones(3)})
    with pytest.raises(KeyError, match="ns_coeffs.*the names in the tree are"):
        eqopt.tree_utils.tree_get(state, "ns_coeffs")
    with pytest.raises(KeyError, match="found no value under 'lr'.*'count'"):
        eqopt.tree_utils.tree_set(state, lr=1.0)
    # A name that no state has is Optax's default.
    assert eqopt.tree_utils.tree_get(state, "no_such_field", default=3) == 3


def test_tree_set_with_optax_name():
    state = eqopt.contrib.scale_by_ademamix().init({"w": jnp.ones(2)})
    new = eqopt.tree_utils.tree_set(state, count_m2=jnp.asarray(5, jnp.int32))
    assert int(new.count) == 5
    found = eqopt.tree_utils.tree_get_all_with_path(state, "count_m2")
    assert [path for path, _ in found] == [
        (eqopt.tree_utils.NamedTupleKey("ScaleByAdemamixState", "count"),)
    ]
    found = eqopt.tree.get_all_with_path(state, "count_m2")
    assert [jax.tree_util.keystr(path) for path, _ in found] == [".count"]


# ---------------------------------------------------------------------------
# Optax's documented programs, with `optax` being eqopt
# ---------------------------------------------------------------------------


def _lbfgs_loop(optax, fun, params, max_iter=50, tol=1e-6):
    """Optax's documented L-BFGS loop: stop on `tree_get(state, "count")`/`"grad"`."""
    opt = optax.lbfgs()  # scale_by_lbfgs, then scale_by_zoom_linesearch
    value_and_grad = optax.value_and_grad_from_state(fun)

    def step(carry):
        params, state = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(
            grad, state, params, value=value, grad=grad, value_fn=fun
        )
        return optax.apply_updates(params, updates), state

    def keep_going(carry):
        _, state = carry
        count = optax.tree_utils.tree_get(state, "count")
        grad = optax.tree_utils.tree_get(state, "grad")
        error = optax.tree_utils.tree_norm(grad)
        return (count == 0) | ((count < max_iter) & (error >= tol))

    params, state = jax.lax.while_loop(keep_going, step, (params, opt.init(params)))
    return params, optax.tree_utils.tree_get(state, "count")


def test_optax_lbfgs_loop_runs_on_eqopt():
    def rosenbrock(x):
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    start = jnp.zeros(5)
    ours, our_count = _lbfgs_loop(optax_port, rosenbrock, start)
    theirs, their_count = _lbfgs_loop(optax, rosenbrock, start)
    np.testing.assert_allclose(ours, jnp.ones(5), atol=1e-3)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    assert 0 < int(our_count) < 50 and abs(int(our_count) - int(their_count)) <= 2
    # The line search's state holds the `value` and `grad` the loop reads.
    state = optax_port.lbfgs().init(start)
    assert optax_port.tree_utils.tree_get(state, "value").shape == ()
    assert optax_port.tree_utils.tree_get(state, "grad").shape == start.shape


def _train_and_log(optax, steps=5):
    """A training step that logs the injected learning rate and lowers it.

    As Optax's docs do: read with `tree_get`, changed with `tree_set`.
    """
    opt = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-4)
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    x, y = jnp.arange(12.0).reshape(4, 3) / 12, jnp.ones((4, 2))

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"][None, :] - y) ** 2)

    @jax.jit
    def step(params, state):
        grads = jax.grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    logged = []
    for index in range(steps):
        params, state = step(params, state)
        rate = optax.tree_utils.tree_get(state, "learning_rate")
        logged.append(float(rate))
        if index == 1:
            state = optax.tree_utils.tree_set(state, learning_rate=rate / 10)
    return params, logged


def test_logging_the_injected_learning_rate_runs_on_eqopt():
    ours, our_log = _train_and_log(optax_port)
    theirs, their_log = _train_and_log(optax)
    np.testing.assert_allclose(our_log, their_log, rtol=1e-6)
    assert our_log[0] == pytest.approx(1e-2) and our_log[-1] == pytest.approx(1e-3)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6)


def test_tree_get_paths_name_state_fields_as_optax_does():
    """Optax's paths: a `NamedTupleKey` for a state's field, so Optax's `filtering` works."""
    tu = eqopt.tree_utils
    params = jnp.ones(3)
    state = eqopt.scale_by_adam().init(params)
    assert tu.tree_get_all_with_path(state, "count") == [
        ((tu.NamedTupleKey("ScaleByAdamState", "count"),), state.count)
    ]
    # eqopt.tree keeps JAX's keys.
    assert eqopt.tree.get_all_with_path(state, "count") == [
        ((jax.tree_util.GetAttrKey("count"),), state.count)
    ]
    chain = eqopt.chain(eqopt.add_noise(1.0, 0.9, 0), eqopt.scale_by_adam())
    state = chain.init(params)

    def adam_only(path, _):
        return (
            isinstance(path[-1], tu.NamedTupleKey)
            and path[-1].tuple_name == "ScaleByAdamState"
        )

    with pytest.raises(KeyError, match="found 2 values"):
        tu.tree_get(state, "count")
    assert tu.tree_get(state, "count", filtering=adam_only) is state[1].count
    new = tu.tree_set(state, adam_only, count=jnp.asarray(42))
    assert int(new[1].count) == 42 and int(new[0].count) == 0
    # A dict's keys stay JAX's.
    tree = {"hparams": {"learning_rate": 1.0}, "learning_rate": "foo"}
    found = tu.tree_get_all_with_path(
        tree, "learning_rate", lambda _, value: isinstance(value, float)
    )
    assert found == [
        (
            (jax.tree_util.DictKey("hparams"), jax.tree_util.DictKey("learning_rate")),
            1.0,
        )
    ]


def test_tree_allclose_compares_numbers_with_the_tolerances():
    tu = eqopt.tree_utils
    assert tu.tree_allclose(1, 1 + 1e-7)
    assert not tu.tree_allclose(1, 2)
    assert tu.tree_allclose({"p": 0.1, "f": "relu"}, {"p": 0.1 + 1e-9, "f": "relu"})
    assert not tu.tree_allclose({"f": "relu"}, {"f": "gelu"})
    assert tu.tree_allclose(1.0, 1.5, atol=1.0)
    assert not tu.tree_allclose(None, 1.0)


@pytest.mark.parametrize(
    "name, args",
    [
        ("tree_vdot", ((1.0, {"k": 2.0}), (3.0, {"k": 4.0}))),
        ("tree_add_scale", (3, 0.1, 2)),
        ("tree_add", ((1.0, jnp.ones(2)), (2.0, jnp.ones(2)))),
        ("tree_norm", ((3.0, {"k": 4}),)),
        ("tree_sum", ([1.5, jnp.arange(3.0)],)),
        ("tree_max", ([10000, jnp.zeros(0, jnp.int8)],)),
        ("tree_min", ([-jnp.inf, jnp.zeros(0)],)),
        ("tree_size", ((1.0, {"k": 1.0, "l": jnp.ones(3)}),)),
        ("tree_zeros_like", ((1.0, {"k": 2}),)),
        ("tree_scale", (2.0, (1.0, jnp.ones(2)))),
    ],
)
def test_python_numbers_are_data_as_in_optax(name, args):
    # Optax's rule under Optax's names; `eqopt.tree` keeps Equinox's.
    ours = getattr(eqopt.tree_utils, name)(*args)
    theirs = getattr(optax.tree_utils, name)(*args)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_eqopt_tree_leaves_python_numbers_alone():
    model = {"w": jnp.array([3.0, 4.0]), "p": 0.5}  # `p` as a `Dropout.p`
    assert float(eqopt.tree.norm(model)) == 5.0
    assert float(eqopt.tree_utils.tree_norm(model)) == pytest.approx(5.0249378)
    assert eqopt.tree.add(model, model)["p"] == 0.5
    assert float(eqopt.tree_utils.tree_add(model, model)["p"]) == 1.0
