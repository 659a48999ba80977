"""The one description of an optimiser's hyperparameters (`eqopt/_hyperparameters.py`):
what a parameter group can override is what `eqopt.current_hyperparams` reports,
under the same keys, over optimisers of several shapes."""

import equinox as eqx
import jax
import numpy as np
import pytest
from helpers import make_model

import eqopt
import eqopt.contrib
from eqopt._hyperparameters import describe, overridable
from eqopt._param_groups import hyperparameter_parts

SCHEDULE = eqopt.cosine_decay_schedule(1e-3, 100, alpha=0.1)
OPTIMISERS = {
    "adamw-schedule": lambda: eqopt.adamw(SCHEDULE, weight_decay=0.1),
    "muon-partition": lambda: eqopt.contrib.muon(1e-3),
    "chain-clip-adam": lambda: eqopt.chain(eqopt.clip(1.0), eqopt.adam(1e-3)),
    "param_groups-inside": lambda: eqopt.param_groups(
        eqopt.adamw(1e-3, weight_decay=0.1), [eqopt.Group(r"^b$", lr_mult=2.0)]
    ),
    "injected": lambda: eqopt.inject_hyperparams(eqopt.adamw)(
        learning_rate=SCHEDULE, b1=0.8
    ),
}
# The rates of each group of a `param_groups` inside (the optimiser's times the
# multipliers): reported, and not hyperparameters to override.
GROUP_RATES = {
    "param_groups-inside": {
        f"{group}.{name}"
        for group in ("^b$", "default")
        for name in ("learning_rate", "weight_decay")
    }
}


@pytest.mark.filterwarnings("ignore:.*selects")  # a branch without leaves here
@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_what_a_group_overrides_is_what_is_reported(name):
    model = make_model()
    opt = OPTIMISERS[name]()
    reported = eqopt.current_hyperparams(opt, opt.init(model))
    described = describe(opt, parts=hyperparameter_parts)
    keys = {k for k, h in overridable(described).items() if h.value is not None}
    assert keys == set(reported) - GROUP_RATES.get(name, set())
    # Every key, overridden in a group (a bare name where there is one, else the
    # full key; then every full key), is the value that group reports.
    full = {h.key: h for h in described if h.value is not None}
    short = {k: h.key for k, h in overridable(described).items() if k not in full}
    by_short = {h: k for k, h in short.items()}
    for chosen in (
        [by_short.get(key, key) for key in full],
        list(full),
    ):
        given = {k: 0.5 * np.asarray(reported[k]) + 0.25 for k in chosen}
        grouped = eqopt.param_groups(opt, [eqopt.Group(r"^w$", name="g", **given)])
        values = eqopt.current_hyperparams(grouped, grouped.init(model))
        for key, value in given.items():
            np.testing.assert_allclose(values[f"g.{short.get(key, key)}"], value)
            unchanged = values[f"default.{short.get(key, key)}"]
            np.testing.assert_allclose(unchanged, reported[key])


def test_a_schedules_argument_is_refused():
    with pytest.raises(ValueError, match=r"alpha, an argument of the schedule of"):
        eqopt.param_groups(
            OPTIMISERS["adamw-schedule"](), [eqopt.Group("w", name="g", alpha=0.5)]
        )


def test_a_shared_name_sets_every_part_that_has_it():
    # A group's `learning_rate` on Muon is both parts' rate (its Muon part and its
    # Adam part); a full key sets one.
    model = make_model()
    muon = OPTIMISERS["muon-partition"]()
    keys = [h.key for h in describe(muon) if h.name == "learning_rate"]
    assert len(keys) == 2
    for given, expected in (
        ({"learning_rate": 0.5}, {keys[0]: 0.5, keys[1]: 0.5}),
        ({keys[1]: 0.25}, {keys[0]: 1e-3, keys[1]: 0.25}),
    ):
        grouped = eqopt.param_groups(muon, [eqopt.Group(r"^w$", name="g", **given)])
        values = eqopt.current_hyperparams(grouped, grouped.init(model))
        for key, value in expected.items():
            np.testing.assert_allclose(values[f"g.{key}"], value, rtol=1e-6)
            np.testing.assert_allclose(values[f"default.{key}"], 1e-3, rtol=1e-6)


def test_the_report_counts_steps_as_current_hyperparams():
    # The step its parts agree on; `None` where they keep different ones.
    model = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    opt = eqopt.param_groups(eqopt.adamw(SCHEDULE), [eqopt.Group("bias", b1=0.8)])
    state = opt.init(model)
    assert eqopt.param_groups_report(opt, state).step == 0
    lagging = eqx.tree_at(
        lambda s: s.inner.inner_states["bias"][0].count, state, np.int32(3)
    )
    assert eqopt.param_groups_report(opt, lagging).step is None


def test_a_hyperparameter_that_may_be_infinite_is_described():
    # `curv_rtol` and `increase_factor` may be +inf (one field converter for that,
    # checked by the same `check_fields` as every other): reported and overridable.
    model = make_model()
    zoom = eqopt.scale_by_zoom_linesearch(max_linesearch_steps=3, curv_rtol=0.8)
    back = eqopt.scale_by_backtracking_linesearch(max_backtracking_steps=3)
    for opt, name, value in ((zoom, "curv_rtol", 0.8), (back, "increase_factor", 1.5)):
        reported = eqopt.current_hyperparams(opt, opt.init(model))
        np.testing.assert_allclose(reported[name], value)
        grouped = eqopt.param_groups(
            opt, [eqopt.Group(r"^w$", name="g", **{name: 7.0})]
        )
        values = eqopt.current_hyperparams(grouped, grouped.init(model))
        np.testing.assert_allclose(values[f"g.{name}"], 7.0)
    assert float(
        eqopt.scale_by_zoom_linesearch(3, curv_rtol=float("inf")).curv_rtol
    ) == float("inf")
    with pytest.raises(TypeError, match="`curv_rtol` must be a real number"):
        eqopt.scale_by_zoom_linesearch(3, curv_rtol="0.9")
    with pytest.raises(ValueError, match="curv_rtol"):
        eqopt.scale_by_zoom_linesearch(3, curv_rtol=-1.0)
