r"""Fitting a damped oscillator to noisy data with L-BFGS.

Scientific fitting problems are small, smooth and deterministic: a handful of
parameters, one loss over all the data. That is where a quasi-Newton method with
a line search shines and a first-order method crawls. `eqopt.lbfgs` is Optax's
L-BFGS with the same loop (the line search needs the objective, and
`eqopt.value_and_grad_from_state` reuses the value and gradient it already
computed at the accepted point), and the parameters are an `eqx.Module`:

    value, grad = value_and_grad(model, state=state)
    updates, state = opt.update(grad, state, model, value=value, grad=grad, value_fn=f)
    model = eqopt.apply_updates(model, updates)

The model is a damped oscillator

$$ x(t) = A\, e^{-\gamma t} \cos(\omega t + \varphi), $$

its four parameters fitted by least squares to 200 noisy samples. The frequency
is started from the peak of the data's spectrum (the loss has many local minima
in $\omega$). L-BFGS converges in a few dozen iterations; Adam, from the same
start, is shown for comparison.

    python examples/lbfgs_fitting.py --out lbfgs_fitting.png
    python examples/lbfgs_fitting.py --short     # the quick run the tests use

About 15 s on a 2-core CPU; `--short` (what the tests run) about 13 s,
most of it start-up and compilation.
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from jaxtyping import Array, Float
from tqdm import tqdm

import eqopt

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class DampedOscillator(eqx.Module):
    """`x(t) = amplitude * exp(-decay * t) * cos(frequency * t + phase)`."""

    amplitude: Float[Array, ""]
    decay: Float[Array, ""]
    frequency: Float[Array, ""]
    phase: Float[Array, ""]

    def __call__(self, t):
        envelope = self.amplitude * jnp.exp(-self.decay * t)
        return envelope * jnp.cos(self.frequency * t + self.phase)


TRUE = DampedOscillator(
    amplitude=jnp.asarray(2.0),
    decay=jnp.asarray(0.3),
    frequency=jnp.asarray(3.0),
    phase=jnp.asarray(0.5),
)


@eqx.filter_jit
def make_data(key, num_points: int = 200, noise: float = 0.1):
    t = jnp.linspace(0.0, 10.0, num_points)
    return t, TRUE(t) + noise * jax.random.normal(key, t.shape)


def initial_guess(t, x):
    """A rough start: the amplitude of the data, the peak of its spectrum."""
    spectrum = np.abs(np.fft.rfft(np.asarray(x)))
    frequencies = 2 * np.pi * np.fft.rfftfreq(len(t), d=float(t[1] - t[0]))
    peak = frequencies[1 + np.argmax(spectrum[1:])]
    return DampedOscillator(
        amplitude=jnp.max(jnp.abs(x)),
        decay=jnp.asarray(0.1),
        frequency=jnp.asarray(peak, dtype=jnp.float32),
        phase=jnp.asarray(0.0),
    )


def loss_fn(model, t, x):
    return jnp.mean((model(t) - x) ** 2)


@eqx.filter_jit
def lbfgs_step(opt, model, state, t, x):
    def value_fn(model):  # the objective of the line search: params only
        return loss_fn(model, t, x)

    value_and_grad = eqopt.value_and_grad_from_state(value_fn)
    value, grad = value_and_grad(model, state=state)
    updates, state = opt.update(
        grad, state, model, value=value, grad=grad, value_fn=value_fn
    )
    return eqopt.apply_updates(model, updates), state, value


@eqx.filter_jit
def adam_step(opt, model, state, t, x):
    value, grad = eqx.filter_value_and_grad(loss_fn)(model, t, x)
    updates, state = opt.update(grad, state, model)
    return eqopt.apply_updates(model, updates), state, value


def describe(model) -> str:
    return ", ".join(
        f"{name} {float(getattr(model, name)):.3f}"
        for name in ("amplitude", "decay", "frequency", "phase")
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=50, help="L-BFGS steps")
    parser.add_argument("--adam-steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="lbfgs_fitting.png", help="plot file")
    parser.add_argument("--short", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    if args.short:
        args.iterations, args.adam_steps = 30, 200

    t, x = make_data(jax.random.key(args.seed))
    start = initial_guess(t, x)
    print(f"true:          {describe(TRUE)}")
    print(f"initial guess: {describe(start)}")

    opt = eqopt.lbfgs()
    model, state = start, opt.init(start)
    lbfgs_losses = []
    for _ in tqdm(range(args.iterations), desc="L-BFGS", unit="iteration"):
        model, state, value = lbfgs_step(opt, model, state, t, x)
        lbfgs_losses.append(float(value))
    lbfgs_losses.append(float(loss_fn(model, t, x)))
    fitted = model
    print(f"L-BFGS fit:    {describe(fitted)}")
    print(
        f"L-BFGS final loss: {lbfgs_losses[-1]:.5f} after {args.iterations} iterations"
    )

    adam = eqopt.adam(1e-2)
    model, state = start, adam.init(start)
    adam_losses = []
    for _ in tqdm(range(args.adam_steps), desc="Adam", unit="step"):
        model, state, value = adam_step(adam, model, state, t, x)
        adam_losses.append(value)
    adam_losses = np.asarray(jax.device_get(adam_losses))
    print(
        f"Adam final loss:   {float(loss_fn(model, t, x)):.5f} after {args.adam_steps} steps"
    )
    best = min(lbfgs_losses[-1], float(adam_losses[-1]))
    for name, losses in (("L-BFGS", lbfgs_losses), ("Adam", adam_losses)):
        close = np.flatnonzero(np.asarray(losses) <= 1.001 * best)
        when = f"after {close[0]} iterations" if len(close) else "not reached"
        print(f"{name} within 0.1% of the best loss: {when}")

    fig, (ax_fit, ax_loss) = plt.subplots(1, 2, figsize=(12, 4))
    dense = jnp.linspace(0.0, 10.0, 1000)
    ax_fit.plot(t, x, ".", color="grey", alpha=0.6, label="noisy data")
    ax_fit.plot(dense, TRUE(dense), color="k", lw=1, label="true curve")
    ax_fit.plot(dense, fitted(dense), "--", color="C3", lw=2, label="L-BFGS fit")
    ax_fit.set(xlabel="t", ylabel="x(t)", title="Damped oscillator: data and fit")
    ax_fit.legend()
    ax_loss.plot(
        np.arange(1, len(lbfgs_losses) + 1), lbfgs_losses, marker=".", label="L-BFGS"
    )
    ax_loss.plot(np.arange(1, len(adam_losses) + 1), adam_losses, label="Adam (1e-2)")
    ax_loss.axhline(0.1**2, color="grey", ls=":", label="noise variance")
    ax_loss.set(xscale="log", yscale="log", xlabel="iteration")
    ax_loss.set(ylabel="mean squared error", title="Loss per iteration")
    ax_loss.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"saved plot to {args.out}")


if __name__ == "__main__":
    main()
