"""The optimisers of the suite: one registry line each, name -> `Spec(factory, lrs)`.

`factory(lr, ctx)` builds the optimiser from a learning rate `lr` (a schedule
whose peak is the swept rate, or the traced rate itself; see `Spec.schedule`)
and a `Context` holding the model and its hidden matrices. It is called inside
the vmapped function, so the rate is a traced array: an optimiser joins the
suite by one line here.

Every other hyperparameter is the authors' default or the value eqopt's
examples use; the learning rate is swept on a grid of 5 half-decades around
the usual value.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np

import eqopt
import eqopt.contrib as c

WD = 1e-2  # decoupled weight decay of the AdamW-like optimisers


@dataclasses.dataclass(frozen=True)
class Context:
    """What a factory may need besides the rate: the model and its hidden matrices."""

    model: Any
    hidden: Any  # a bool pytree like the model: True at the hidden weight matrices
    rate: Callable[[float], Any]  # rate(s): the learning rate with peak s * lr
    steps: int  # the step budget


class Spec(NamedTuple):
    """An optimiser of the suite.

    - `factory(lr, ctx)`: the optimiser.
    - `lrs`: the learning-rate grid.
    - `schedule`: "cosine" (linear warmup over 5% of the budget, then cosine
      decay to 0, peak `lr`), or "warmup" (the warmup only; schedule-free).
    - `eval_params(state, model)`: the parameters to validate, where they are
      not the iterate (schedule-free, SPlus).
    - `extra_args`: `update` takes `value`, `grad`, `value_fn` (L-BFGS).
    - `only`: the workloads it is meant for (`None`: all).
    """

    factory: Callable[[Any, Context], Any]
    lrs: tuple[float, ...]
    schedule: str = "cosine"
    eval_params: Callable[[Any, Any], Any] | None = None
    extra_args: bool = False
    only: tuple[str, ...] | None = None


def grid(centre: float, n: int = 5) -> tuple[float, ...]:
    """`n` rates half a decade apart, centred on `centre`."""
    return tuple(float(centre * 10 ** (0.5 * (i - n // 2))) for i in range(n))


ROWS = c.MuonDimensionNumbers(reduction_axis=1, output_axis=0)  # Linear is (out, in)


def _rows(ctx: Context):
    """Muon's dimension numbers at the hidden matrices, `None` elsewhere."""
    return jax.tree.map(lambda h: ROWS if h else None, ctx.hidden)


def _with_adamw(inner, ctx: Context, scale: float = 1.0):
    """`inner` on the hidden matrices, AdamW (peak rate `scale * lr`) on the rest."""
    labels = jax.tree.map(lambda h: "matrices" if h else "adamw", ctx.hidden)
    adamw = eqopt.adamw(ctx.rate(scale), weight_decay=WD)
    return eqopt.partition({"matrices": inner, "adamw": adamw}, labels)


# Muon-family rates are ~6.7x AdamW's (0.02 against 3e-3); their AdamW part
# keeps that ratio, so one swept rate moves both.
_MUON_TO_ADAM = 0.15


def _muon(lr, ctx):
    return c.muon(
        lr,
        weight_decay=WD,
        muon_weight_dimension_numbers=_rows(ctx),
        adam_learning_rate=ctx.rate(_MUON_TO_ADAM),
        adam_weight_decay=WD,
    )


def _normuon(lr, ctx):
    return c.normuon(
        lr,
        weight_decay=WD,
        normuon_weight_dimension_numbers=_rows(ctx),
        adam_learning_rate=ctx.rate(0.3),
        adam_weight_decay=WD,
    )


def _adamuon(lr, ctx):
    return c.adamuon(
        lr,
        weight_decay=WD,
        adamuon_weight_dimension_numbers=_rows(ctx),
        adam_learning_rate=ctx.rate(0.3),
        adam_weight_decay=WD,
    )


def _muonh(lr, ctx):
    return c.muonh(
        lr,
        muon_weight_dimension_numbers=_rows(ctx),
        adam_learning_rate=ctx.rate(_MUON_TO_ADAM),
    )


def _cautious_adamw(lr, ctx):
    return eqopt.chain(
        eqopt.cautious(eqopt.scale_by_adam(), descent=False),
        eqopt.add_decayed_weights(WD),
        eqopt.scale_by_learning_rate(lr),
    )


def _adamw_8bit(lr, ctx):
    q = eqopt.Quantized(8, min_size=256)
    return eqopt.adamw(lr, weight_decay=WD, mu_dtype=q, nu_dtype=q)


def _adam_mini(lr, ctx):
    blocks = jax.tree.map(
        c.AdamMiniBlocks.default, eqx.filter(ctx.model, eqx.is_inexact_array)
    )
    return c.adam_mini(lr, weight_decay=WD, blocks=blocks)


OPTIMIZERS: dict[str, Spec] = {
    "AdamW": Spec(lambda lr, ctx: eqopt.adamw(lr, weight_decay=WD), grid(1e-2)),
    "NAdamW": Spec(lambda lr, ctx: eqopt.nadamw(lr, weight_decay=WD), grid(1e-2)),
    "Lion": Spec(lambda lr, ctx: eqopt.lion(lr, weight_decay=WD * 10), grid(1e-3)),
    "SGD Nesterov": Spec(
        lambda lr, ctx: eqopt.sgd(lr, momentum=0.9, nesterov=True), grid(1e-1)
    ),
    "Muon": Spec(_muon, grid(2e-2)),
    "NorMuon": Spec(_normuon, grid(1e-2)),
    "SOAP": Spec(
        lambda lr, ctx: _with_adamw(c.soap(lr, weight_decay=WD), ctx), grid(1e-2)
    ),
    "Shampoo": Spec(
        lambda lr, ctx: _with_adamw(
            c.shampoo(
                lr,
                b2=0.95,
                grafting="adam",
                weight_decay=WD,
                preconditioning_compute_steps=10,
            ),
            ctx,
        ),
        grid(1e-2),
    ),
    "PSGD Kron": Spec(
        lambda lr, ctx: _with_adamw(c.kron(lr, weight_decay=WD), ctx, 3.0),
        grid(3e-3),
    ),
    "MARS": Spec(lambda lr, ctx: c.mars_adamw(lr, weight_decay=WD), grid(1e-2)),
    "AdEMAMix": Spec(lambda lr, ctx: c.ademamix(lr, weight_decay=WD), grid(1e-2)),
    "ADOPT": Spec(lambda lr, ctx: c.adopt(lr), grid(1e-2)),
    "Adam-mini": Spec(_adam_mini, grid(1e-2)),
    "cautious AdamW": Spec(_cautious_adamw, grid(1e-2)),
    "schedule-free AdamW": Spec(
        lambda lr, ctx: c.schedule_free_adamw(
            lr, warmup_steps=max(1, ctx.steps // 20), weight_decay=WD
        ),
        grid(1e-2),
        schedule="warmup",
        eval_params=c.schedule_free_eval_params,
    ),
    "Prodigy": Spec(lambda lr, ctx: c.prodigy(lr, weight_decay=WD), grid(1.0, 3)),
    "D-Adaptation": Spec(
        lambda lr, ctx: c.dadapt_adamw(lr, weight_decay=WD), grid(1.0, 3)
    ),
    "8-bit AdamW": Spec(_adamw_8bit, grid(1e-2)),
    "AdaMuon": Spec(_adamuon, grid(1e-2)),
    "Scion": Spec(lambda lr, ctx: c.scion(lr), grid(3e-2)),
    "LaProp": Spec(lambda lr, ctx: c.laprop(lr, weight_decay=WD), grid(1e-2)),
    "MuonH": Spec(_muonh, grid(2e-2)),
    "AdamH": Spec(lambda lr, ctx: c.adamh(lr), grid(1e-2)),
    "SPlus": Spec(
        lambda lr, ctx: c.splus(lr, inverse_every=10),
        grid(1e-1),
        eval_params=c.splus_eval_params,
    ),
    "Dion": Spec(
        lambda lr, ctx: _with_adamw(c.dion(lr), ctx, _MUON_TO_ADAM), grid(2e-2)
    ),
    "L-BFGS": Spec(
        lambda lr, ctx: eqopt.lbfgs(lr),
        (0.25, 0.5, 1.0),
        schedule="none",
        extra_args=True,
        only=("logreg",),
    ),
}

BASELINE = "AdamW"  # sets every workload's target; always run first
QUICK_OPTIMIZERS = ("AdamW", "NAdamW", "Lion", "SGD Nesterov", "Muon")
QUICK_WORKLOADS = ("digits_mlp", "teacher_student")


def learning_rate(spec: Spec, peak, steps: int):
    """The rate a factory gets: a schedule with peak `peak`, or `peak` itself."""
    warmup = max(1, steps // 20)
    if spec.schedule == "cosine":
        return eqopt.warmup_cosine_decay_schedule(0.0, peak, warmup, steps, 0.0)
    return peak  # "warmup": schedule-free warms up itself; "none": constant


def lr_grid(spec: Spec) -> np.ndarray:
    return np.asarray(spec.lrs, np.float32)
