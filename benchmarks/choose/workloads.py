"""The workloads of the optimiser suite: model, data, loss, validation metric, budget.

Every workload is a pure-JAX problem: its data is an array closed over by the
training program (scikit-learn's bundled digits, the standard library's
docstrings of `examples/char_lm.py`, or generated), a batch is drawn inside the
program from `(data_key, step)`, and the validation metric (lower is better) is
computed inside it too. A run is then one traced function of a learning rate
and a seed, which is what lets the protocol `vmap` a whole sweep.
"""

import dataclasses
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

_EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
if str(_EXAMPLES) not in sys.path:
    sys.path.insert(0, str(_EXAMPLES))


@dataclasses.dataclass(frozen=True)
class Workload:
    """One problem of the suite.

    `init(key)` builds a model; `batch(key, step)` draws a training batch;
    `loss(model, batch)` is the training loss; `evaluate(model)` the validation
    metric (lower is better, named by `metric`); `hidden(model)` marks the
    hidden weight matrices (`True`), the leaves the matrix optimisers (Muon,
    SOAP, ...) take, every other leaf going to AdamW. `steps` is the budget,
    `eval_every` the spacing of the validation points.
    """

    name: str
    metric: str
    steps: int
    eval_every: int
    init: Callable[[Any], Any]
    batch: Callable[[Any, Any], Any]
    loss: Callable[[Any, Any], Any]
    evaluate: Callable[[Any], Any]
    hidden: Callable[[Any], Any]
    config: dict
    # Whether the sweep runs vmapped: on a CPU, a vmapped batch of convolutions
    # or of scanned blocks cost more per run than one run at a time (measured),
    # so those workloads run their sweep one run after another (one compile).
    vmap: bool = True


def _cross_entropy(logits, labels):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=-1))


def _error(logits, labels):
    return jnp.mean(jnp.argmax(logits, -1) != labels).astype(jnp.float32)


def _linears_hidden(model, inner: Callable[[Any], Any]):
    """`True` at the weight of every `eqx.nn.Linear` inside `inner(model)`."""
    spec = jax.tree.map(lambda _: False, model)
    is_linear = lambda x: isinstance(x, eqx.nn.Linear)  # noqa: E731

    def mark(node):
        labels = jax.tree.map(lambda _: False, node)
        if is_linear(node):
            labels = eqx.tree_at(lambda layer: layer.weight, labels, True)
        return labels

    marked = jax.tree.map(mark, inner(model), is_leaf=is_linear)
    return eqx.tree_at(inner, spec, marked)


def _minibatch(x, y, batch_size):
    def batch(key, step):
        idx = jax.random.randint(
            jax.random.fold_in(key, step), (batch_size,), 0, x.shape[0]
        )
        return x[idx], y[idx]

    return batch


def _digits(val_fraction=0.2):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    n_val = int(len(x) * val_fraction)
    return (x[n_val:], y[n_val:]), (x[:n_val], y[:n_val])


def digits_mlp(steps=800, batch_size=64, width=128, eval_every=25) -> Workload:
    (xt, yt), (xv, yv) = _digits()
    xt, yt, xv, yv = map(jnp.asarray, (xt, yt, xv, yv))

    def init(key):
        return eqx.nn.MLP(64, 10, width, 2, activation=jax.nn.relu, key=key)

    def loss(model, batch):
        x, y = batch
        return _cross_entropy(jax.vmap(model)(x), y)

    return Workload(
        "digits_mlp",
        "validation error",
        steps,
        eval_every,
        init,
        _minibatch(xt, yt, batch_size),
        loss,
        lambda model: _error(jax.vmap(model)(xv), yv),
        lambda model: _linears_hidden(model, lambda m: m.layers[1:-1]),
        dict(steps=steps, batch_size=batch_size, width=width),
    )


class SmallCNN(eqx.Module):
    """Two 3x3 convolutions on the 8x8 digits, a 2x2 pooling, a hidden layer, a readout."""

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    hidden: eqx.nn.Linear
    readout: eqx.nn.Linear

    def __init__(self, channels: int, *, key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.conv1 = eqx.nn.Conv2d(1, channels, 3, padding=1, key=k1)
        self.conv2 = eqx.nn.Conv2d(channels, 2 * channels, 3, padding=1, key=k2)
        self.hidden = eqx.nn.Linear(2 * channels * 16, 64, key=k3)
        self.readout = eqx.nn.Linear(64, 10, key=k4)

    def __call__(self, x):
        h = jax.nn.relu(self.conv1(x.reshape(1, 8, 8)))
        h = jax.nn.relu(self.conv2(h))
        h = h.reshape(h.shape[0], 4, 2, 4, 2).mean(axis=(2, 4))
        return self.readout(jax.nn.relu(self.hidden(h.reshape(-1))))


def digits_cnn(steps=400, batch_size=32, channels=4, eval_every=25) -> Workload:
    (xt, yt), (xv, yv) = _digits()
    xt, yt, xv, yv = map(jnp.asarray, (xt, yt, xv, yv))

    def loss(model, batch):
        x, y = batch
        return _cross_entropy(jax.vmap(model)(x), y)

    return Workload(
        "digits_cnn",
        "validation error",
        steps,
        eval_every,
        lambda key: SmallCNN(channels, key=key),
        _minibatch(xt, yt, batch_size),
        loss,
        lambda model: _error(jax.vmap(model)(xv), yv),
        lambda model: eqx.tree_at(
            lambda m: m.hidden.weight, jax.tree.map(lambda _: False, model), True
        ),
        dict(steps=steps, batch_size=batch_size, channels=channels),
        vmap=False,
    )


def _text_split(seq_len):
    import char_lm  # examples/char_lm.py

    task = char_lm.make_task(seq_len=seq_len)
    data = jnp.asarray(task.data)
    cut = int(0.9 * len(task.data))
    return char_lm, task.vocab, data[:cut], data[cut:]


def _windows(data, seq_len):
    def window(start):
        return jax.lax.dynamic_slice(data, (start,), (seq_len + 1,))

    return jax.vmap(window)


def _text_workload(
    name, init, hidden, steps, batch_size, seq_len, eval_every, cfg, vmap=True
):
    char_lm, vocab, train, val = _text_split(seq_len)
    take_train, take_val = _windows(train, seq_len), _windows(val, seq_len)
    # The held-out text: 64 windows spread evenly over the last 10% of the text.
    val_tokens = take_val(jnp.linspace(0, len(val) - seq_len - 2, 64).astype(jnp.int32))

    def batch(key, step):
        starts = jax.random.randint(
            jax.random.fold_in(key, step), (batch_size,), 0, len(train) - seq_len - 1
        )
        return take_train(starts)

    return Workload(
        name,
        "held-out loss",
        steps,
        eval_every,
        lambda key: init(char_lm, vocab, seq_len, key),
        batch,
        char_lm.loss_fn,
        lambda model: char_lm.loss_fn(model, val_tokens),
        hidden,
        dict(steps=steps, batch_size=batch_size, seq_len=seq_len, **cfg),
        vmap,
    )


def char_lm_workload(
    steps=300, batch_size=16, seq_len=32, width=32, depth=2, eval_every=25
) -> Workload:
    """`examples/char_lm.py`'s transformer, trained on 90% of its text."""

    def init(char_lm, vocab, seq_len, key):
        return char_lm.CharLM(vocab, seq_len, width=width, depth=depth, key=key)

    return _text_workload(
        "char_lm",
        init,
        lambda model: _linears_hidden(model, lambda m: m.blocks),
        steps,
        batch_size,
        seq_len,
        eval_every,
        dict(width=width, depth=depth),
    )


def scanned_lm(
    steps=250, batch_size=16, seq_len=32, width=32, depth=4, eval_every=25
) -> Workload:
    """`examples/scanned_blocks.py`'s model: the blocks built by `eqx.filter_vmap`
    (stacked on a leading axis) and run by `lax.scan`."""
    import scanned_blocks  # examples/scanned_blocks.py

    def init(char_lm, vocab, seq_len, key):
        listed = char_lm.CharLM(vocab, seq_len, width=width, depth=depth, key=key)
        return scanned_blocks.scanned_of(listed)

    return _text_workload(
        "scanned_lm",
        init,
        lambda model: _linears_hidden(model, lambda m: m.blocks),
        steps,
        batch_size,
        seq_len,
        eval_every,
        dict(width=width, depth=depth),
        vmap=False,
    )


def teacher_student(
    steps=800, batch_size=64, dim=16, width=16, depth=8, eval_every=25
) -> Workload:
    """A deep narrow tanh MLP fits a fixed teacher of the same shape. The teacher
    sees whitened inputs, the student the same inputs scaled over two decades, so
    the weights the student needs span two decades too (ill-conditioned)."""
    teacher = eqx.nn.MLP(dim, 1, width, depth, jax.nn.tanh, key=jax.random.key(1234))
    # Weights x2 (std ~1.15/sqrt(fan_in)): the teacher's signal survives its depth.
    teacher = jax.tree.map(
        lambda x: 2.0 * x if eqx.is_array(x) and x.ndim == 2 else x, teacher
    )
    scales = jnp.logspace(0, -2, dim)
    outputs = jax.jit(jax.vmap(teacher))(
        jax.random.normal(jax.random.key(5), (4096, dim))
    )
    centre, spread = jnp.mean(outputs), jnp.std(outputs)

    def sample(key, n):
        z = jax.random.normal(key, (n, dim))
        return z * scales[None, :], (jax.vmap(teacher)(z) - centre) / spread

    xv, yv = sample(jax.random.key(4321), 1024)

    def batch(key, step):
        return sample(jax.random.fold_in(key, step), batch_size)

    def loss(model, batch):
        x, y = batch
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    return Workload(
        "teacher_student",
        "validation MSE",
        steps,
        eval_every,
        lambda key: eqx.nn.MLP(dim, 1, width, depth, jax.nn.tanh, key=key),
        batch,
        loss,
        lambda model: loss(model, (xv, yv)),
        lambda model: _linears_hidden(model, lambda m: m.layers[1:-1]),
        dict(steps=steps, batch_size=batch_size, dim=dim, width=width, depth=depth),
    )


def logreg(steps=300, n=4000, dim=64, classes=10, l2=1e-2, eval_every=10) -> Workload:
    """Multinomial logistic regression with an L2 penalty on generated data with
    correlated, badly scaled features; full batch, so the objective is convex and
    deterministic (the setting of quasi-Newton methods)."""
    key_x, key_w, key_v = jax.random.split(jax.random.key(99), 3)
    mix = jax.random.normal(key_w, (dim, dim)) / jnp.sqrt(dim)
    scales = jnp.logspace(0, -2, dim)
    true_w = jax.random.normal(jax.random.key(7), (classes, dim)) * 3.0

    def sample(key, count):
        k1, k2 = jax.random.split(key)
        x = (jax.random.normal(k1, (count, dim)) @ mix) * scales[None, :]
        logits = (x / scales[None, :]) @ true_w.T / jnp.sqrt(dim)
        return x, jax.random.categorical(k2, logits).astype(jnp.int32)

    xt, yt = sample(key_x, n)
    xv, yv = sample(key_v, n)

    def init(key):
        del key  # convex: every seed starts from zero
        linear = eqx.nn.Linear(dim, classes, key=jax.random.key(0))
        return jax.tree.map(jnp.zeros_like, linear)

    def objective(model, x, y):
        penalty = 0.5 * l2 * jnp.sum(model.weight**2)
        return _cross_entropy(jax.vmap(model)(x), y) + penalty

    return Workload(
        "logreg",
        "validation loss",
        steps,
        eval_every,
        init,
        lambda key, step: (xt, yt),
        lambda model, batch: objective(model, *batch),
        lambda model: _cross_entropy(jax.vmap(model)(xv), yv),
        lambda model: jax.tree.map(lambda _: False, model),
        dict(steps=steps, n=n, dim=dim, classes=classes, l2=l2),
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "digits_mlp": digits_mlp,
    "digits_cnn": digits_cnn,
    "char_lm": char_lm_workload,
    "teacher_student": teacher_student,
    "scanned_lm": scanned_lm,
    "logreg": logreg,
}

# A few steps at a tiny size: the smoke test.
TINY: dict[str, dict] = {
    "digits_mlp": dict(steps=20, width=16, eval_every=5),
    "digits_cnn": dict(steps=20, channels=2, eval_every=5),
    "char_lm": dict(steps=20, width=16, depth=1, seq_len=16, eval_every=5),
    "teacher_student": dict(steps=20, depth=3, eval_every=5),
    "scanned_lm": dict(steps=20, width=16, depth=2, seq_len=16, eval_every=5),
    "logreg": dict(steps=20, n=1000, eval_every=5),
}


_BUILT: dict = {}


def get(name: str, **overrides) -> Workload:
    """The workload `name` at its default size, with `overrides` of its arguments
    (built once per process: its compiled programs are kept with it)."""
    key = (name, tuple(sorted(overrides.items())))
    if key not in _BUILT:
        _BUILT[key] = WORKLOADS[name](**overrides)
    return _BUILT[key]
