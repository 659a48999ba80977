"""Every public name of Optax's modules resolves in eqopt's module of the same name.

A porting user reaches names as `optax.<module>.<name>`; under `import eqopt as
optax` each must resolve, to the same object as eqopt's own spelling where
eqopt has one. Names eqopt leaves out on purpose are listed in `DELIBERATE`
with their reason, and on the "Coming from Optax" page.
"""

import importlib
import inspect
import pathlib

import jax.numpy as jnp
import optax
import pytest

import eqopt

#: Optax's modules with public names (`optax.experimental` has none).
MODULES = (
    "",
    "tree_utils",
    "transforms",
    "schedules",
    "losses",
    "contrib",
    "microbatching",
    "projections",
    "second_order",
    "perturbations",
    "assignment",
    "tree",
)

#: `(module, name)` of the Optax names eqopt does not provide, with the reason.
DELIBERATE: dict[tuple[str, str], str] = {}


def _public(module) -> list[str]:
    return sorted(
        name
        for name in dir(module)
        if not name.startswith("_") and not inspect.ismodule(getattr(module, name))
    )


def _counts() -> dict[str, tuple[int, int, list[str]]]:
    counts = {}
    for name in MODULES:
        theirs = importlib.import_module("optax" + (f".{name}" if name else ""))
        ours = importlib.import_module("eqopt" + (f".{name}" if name else ""))
        names = _public(theirs)
        missing = [n for n in names if not hasattr(ours, n)]
        counts[name or "optax"] = (len(names) - len(missing), len(names), missing)
    return counts


def test_every_optax_name_resolves():
    counts = _counts()
    missing = [
        f"{module}.{name}"
        for module, (_, _, names) in counts.items()
        for name in names
        if (module, name) not in DELIBERATE
    ]
    assert missing == []
    resolved = sum(found for found, _, _ in counts.values())
    total = sum(all_ for _, all_, _ in counts.values())
    assert resolved + len(DELIBERATE) == total and total >= 466


def test_deliberate_omissions_are_documented():
    page = (
        pathlib.Path(__file__).resolve().parents[1] / "docs" / "coming-from-optax.md"
    ).read_text(encoding="utf-8")
    for module, name in DELIBERATE:
        assert f"`optax.{module}.{name}`" in page or f"`{name}`" in page


@pytest.mark.parametrize("name", _public(optax.tree_utils))
def test_tree_utils_are_eqopt_tree_functions(name):
    ours = getattr(eqopt.tree_utils, name)
    if name == "NamedTupleKey":
        key = ours("ScaleByAdamState", "mu")
        assert (key.tuple_name, key.name, str(key)) == (
            "ScaleByAdamState",
            "mu",
            str(optax.tree_utils.NamedTupleKey("ScaleByAdamState", "mu")),
        )
        return
    short = name.removeprefix("tree_")
    if name in ("tree_get", "tree_set", "tree_get_all_with_path"):
        # Optax's paths (`NamedTupleKey`), tests/test_tree_utils.py.
        assert ours.__module__ == "eqopt.tree_utils._state"
        return
    # Python numbers in trees are data there, as in Optax (tests/test_tree_utils.py).
    short_one = getattr(eqopt.tree, short)
    assert ours is short_one or ours.__wrapped__ is short_one


@pytest.mark.parametrize("name", _public(optax.transforms))
def test_transforms_are_the_top_level_objects(name):
    ours = getattr(eqopt.transforms, name)
    if name in ("unitwise_norm", "unitwise_clip", "ConditionFn"):
        return  # defined for this namespace (tests/test_unitwise.py)
    if name == "NonNegativeParamsState":
        assert ours is eqopt.EmptyState
        return
    assert ours is getattr(eqopt, name)


STATE_NAMES = {
    "AdaptiveGradClipState": lambda: eqopt.adaptive_grad_clip(1.0),
    "AddDecayedWeightsState": lambda: eqopt.add_decayed_weights(1e-2),
    "ClipByGlobalNormState": lambda: eqopt.clip_by_global_norm(1.0),
    "ClipState": lambda: eqopt.clip(1.0),
    "NonNegativeParamsState": eqopt.keep_params_nonnegative,
    "ScaleByTrustRatioState": eqopt.scale_by_trust_ratio,
    "ScaleState": lambda: eqopt.scale(2.0),
    "FactoredState": eqopt.scale_by_factored_rms,
    "MultiTransformState": lambda: eqopt.multi_transform(
        {"a": eqopt.sgd(1.0)}, {"w": "a"}
    ),
    "ScaleByAdaDeltaState": eqopt.scale_by_adadelta,
    "ScaleByRStdDevState": eqopt.scale_by_stddev,
}


@pytest.mark.parametrize("name", sorted(STATE_NAMES))
def test_optax_state_names_are_what_init_returns(name):
    """`isinstance(state, optax.<Name>State)` holds for the state of that transform."""
    state = STATE_NAMES[name]().init({"w": jnp.ones((4, 3))})
    assert isinstance(state, getattr(eqopt, name))
    assert inspect.isclass(getattr(eqopt, name))


def test_schedule_names():
    assert eqopt.schedules.Schedule is eqopt.Schedule
    assert eqopt.schedules.StatefulSchedule is eqopt.AbstractStatefulSchedule
    assert isinstance(
        eqopt.WrappedSchedule(eqopt.schedules.constant_schedule(1.0)),
        eqopt.schedules.StatefulSchedule,
    )


def test_masked_node_stands_for_eqopt_masked_leaves():
    """eqopt keeps `None` where Optax keeps `MaskedNode()`: both are `MaskedNode`s."""
    assert eqopt.transforms.MaskedNode is eqopt.MaskedNode
    assert isinstance(None, eqopt.MaskedNode)
    assert isinstance(eqopt.MaskedNode(), eqopt.MaskedNode)
    assert not isinstance(jnp.zeros(()), eqopt.MaskedNode)
    assert len(eqopt.MaskedNode()) == 0
    opt = eqopt.masked(eqopt.scale_by_adam(), {"w": True, "b": False})
    state = opt.init({"w": jnp.ones(3), "b": jnp.ones(2)})
    assert isinstance(state.inner_state.mu["b"], eqopt.MaskedNode)
    assert not isinstance(state.inner_state.mu["w"], eqopt.MaskedNode)
