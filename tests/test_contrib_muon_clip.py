"""MuonClip (`eqopt.contrib.muon_clip`, `QKClip`, `attention_max_logits`): Muon then
QK-clip of the attention heads whose logits exceeded the threshold.

Against pytorch-optimizer's `MuonClip` (4.1.0), fed the same gradients and the same
per-head logits for 20 steps, on an `eqx.nn.MultiheadAttention` and on bare arrays
marked with `QKClipProjection`; a training step of a small attention model in which
MuonClip keeps the maximum logit near the threshold where Muon lets it grow; a
stacked attention against the list of its layers; `param_groups`.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
from _torch_oracle import torch_steps
from helpers import Case, spec_like

import eqopt
from eqopt.contrib import MuonDimensionNumbers, QKClipProjection

ORACLE = "pytorch-optimizer's MuonClip, compared over 20 steps in this file"


def _registry_logits(model, grads):
    return {"max_logits": {"attn": jnp.array([2.0, 0.5, 4.0])}}


TRANSFORM_CASES = [
    Case(
        "contrib.muon_clip",
        lambda p: eqopt.contrib.muon_clip(
            1e-2,
            qk_clip_threshold=1.0,
            qk_clip_spec=spec_like(
                p, None, w=QKClipProjection("query", heads=3, attention="attn")
            ),
        ),
        None,
        extra_args=_registry_logits,
        no_parity_reason=ORACLE,
    ),
]

DIM, HEADS, SEQ = 16, 2, 6


def _attention(key=0, **kwargs):
    return eqx.nn.MultiheadAttention(HEADS, DIM, key=jax.random.key(key), **kwargs)


def _torch_muon_clip(monkeypatch, groups_of, **kwargs):
    """pytorch-optimizer's MuonClip, its Newton-Schulz in float64 (its default is
    bfloat16, which would hide any difference under rounding)."""
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    torch = import_oracle("torch")
    from pytorch_optimizer.optimizer.muon import base
    from pytorch_optimizer.optimizer.utils import matrix

    exact = functools.partial(
        matrix.zero_power_via_newton_schulz_5, dtype=torch.float64
    )
    monkeypatch.setattr(base, "zero_power_via_newton_schulz_5", exact)
    return lambda tensors: po.MuonClip(groups_of(tensors), **kwargs)


class _StepWithLogits:
    """Feeds `torch_steps`' optimiser the logits of each step (its `step` takes
    them as an argument)."""

    def __init__(self, optimizer, logits):
        self.optimizer, self.logits, self.index = optimizer, logits, 0

    def step(self):
        torch = import_oracle("torch")
        given = {"attn": torch.tensor(np.asarray(self.logits[self.index], np.float64))}
        self.index += 1
        return self.optimizer.step(attention_max_logits=given)


def _problem(steps=20, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {k: (DIM, DIM) for k in ("q", "k", "v", "o")}
    params = {k: rng.normal(size=s).astype(np.float32) / 4 for k, s in shapes.items()}
    grads = [
        {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        for _ in range(steps)
    ]
    # Per-head logits around the threshold 1: some heads clipped, some not.
    logits = rng.uniform(0.5, 3.0, size=(steps, HEADS)).astype(np.float32)
    return params, grads, logits


def _relative(ours, theirs, start):
    worst = 0.0
    for our, their in zip(ours, theirs, strict=True):
        for k in their:
            moved = np.max(np.abs(their[k] - np.asarray(start[k], np.float64)))
            diff = np.max(np.abs(np.asarray(our[k], np.float64) - their[k]))
            worst = max(worst, diff / moved)
    return worst


@pytest.mark.filterwarnings("ignore:The group 'adam'")
@pytest.mark.parametrize("layout", ["equinox", "bare"])
def test_matches_pytorch_optimizer_muon_clip(monkeypatch, layout):
    """20 steps, the same gradients and logits: the parameters agree to 1e-4 of
    their change. Kimi's recipe on both sides: plain momentum, the update's RMS
    matched to 0.2 (pytorch-optimizer's `use_adjusted_lr`), decoupled decay."""
    params, grads, logits = _problem()
    hyper = dict(weight_decay=0.1, beta=0.95, eps=1e-10)
    if layout == "equinox":
        names = {
            "q": "query_proj",
            "k": "key_proj",
            "v": "value_proj",
            "o": "output_proj",
        }
        model = _attention()
        model = eqx.tree_at(
            lambda m: [getattr(m, n).weight for n in names.values()],
            model,
            [jnp.asarray(params[k]) for k in names],
        )
        opt = eqopt.contrib.muon_clip(0.02, qk_clip_threshold=1.0, **hyper)

        def tree(d):
            return eqx.tree_at(
                lambda m: [getattr(m, n).weight for n in names.values()],
                eqx.filter(model, eqx.is_inexact_array),
                [jnp.asarray(d[k]) for k in names],
            )

        def flat(m):
            return {k: np.asarray(getattr(m, n).weight) for k, n in names.items()}

        def logits_of(s):
            return jnp.asarray(s)  # the model is one attention layer

    else:
        # Bare PyTorch-layout (out, in) arrays: Muon's rows and the heads' axis given.
        rows = MuonDimensionNumbers(reduction_axis=1, output_axis=0)
        spec = {
            "q": QKClipProjection("query", HEADS, "attn", output_axis=0),
            "k": QKClipProjection("key", HEADS, "attn", output_axis=0),
            "v": None,
            "o": None,
        }
        opt = eqopt.contrib.muon_clip(
            0.02,
            qk_clip_threshold=1.0,
            qk_clip_spec=spec,
            muon_weight_dimension_numbers={k: rows for k in params},
            **hyper,
        )
        model = {k: jnp.asarray(v) for k, v in params.items()}

        def tree(d):
            return {k: jnp.asarray(v) for k, v in d.items()}

        def flat(m):
            return {k: np.asarray(v) for k, v in m.items()}

        def logits_of(s):
            return {"attn": jnp.asarray(s)}

    step = eqx.filter_jit(lambda m, g, state, s: opt.update(g, state, m, max_logits=s))
    state = opt.init(model)
    ours = []
    for g, s in zip(grads, logits, strict=True):
        updates, state = step(model, tree(g), state, logits_of(s))
        model = eqopt.apply_updates(model, updates)
        ours.append(flat(model))

    def groups(t):
        return [
            dict(
                params=[t["q"]], use_muon=True, attention_name="attn", qk_clip="query"
            ),
            dict(params=[t["k"]], use_muon=True, attention_name="attn", qk_clip="key"),
            dict(params=[t["v"], t["o"]], use_muon=True),
        ]

    make = _torch_muon_clip(
        monkeypatch,
        groups,
        lr=0.02,
        momentum=0.95,
        weight_decay=0.1,
        qk_clip_threshold=1.0,
        qk_clip_alpha=0.5,
    )
    theirs = torch_steps(lambda t: _StepWithLogits(make(t), logits), params, grads)
    difference = _relative(ours, theirs, params)
    print(f"MuonClip ({layout}) vs pytorch-optimizer: {difference:.2e}")
    assert difference < 1e-4


class _Model(eqx.Module):
    """One attention layer and a readout; returns its per-head max logits too."""

    attn: eqx.nn.MultiheadAttention
    out: eqx.nn.Linear

    def __init__(self, key):
        a, b = jax.random.split(jax.random.key(key))
        self.attn = eqx.nn.MultiheadAttention(HEADS, DIM, key=a)
        self.out = eqx.nn.Linear(DIM, 1, key=b)

    def __call__(self, x):
        logits = eqopt.contrib.attention_max_logits(self.attn, x, x)
        return self.out(self.attn(x, x, x)[-1]), {"attn": logits}


def _loss(model, x, y):
    pred, logits = jax.vmap(model)(x)
    # The batch's maximum per head, as the paper's S_max.
    return jnp.mean((pred[:, 0] - y) ** 2), jax.tree.map(
        lambda s: jnp.max(s, axis=0), logits
    )


def _train(opt, steps):
    model = _Model(0)
    x = jax.random.normal(jax.random.key(1), (4, SEQ, DIM))
    # A target only sharp attention fits: the largest first feature of the sequence.
    y = jnp.max(x[..., 0], axis=1) * 10

    @eqx.filter_jit
    def step(model, state):
        (loss, logits), grads = eqx.filter_value_and_grad(_loss, has_aux=True)(
            model, x, y
        )
        updates, state = opt.update(grads, state, model, max_logits=logits)
        return eqopt.apply_updates(model, updates), state, logits["attn"]

    state = opt.init(model)
    seen = []
    for _ in range(steps):
        model, state, logits = step(model, state)
        seen.append(float(jnp.max(logits)))
    _, logits = _loss(model, x, y)
    seen.append(float(jnp.max(logits["attn"])))
    return np.array(seen)


def test_training_step_keeps_the_max_logit_near_the_threshold():
    """Muon lets the logits grow past tau (to over 5 tau in 30 steps); MuonClip's
    clip, after each step from that step's logits, holds them within one step's
    growth of tau (the paper's rule: the logits are the forward pass's, before
    the update)."""
    tau = 1.5
    plain = _train(eqopt.contrib.muon(0.05, consistent_rms=0.2, nesterov=False), 30)
    clipped = _train(eqopt.contrib.muon_clip(0.05, qk_clip_threshold=tau), 30)
    assert plain.max() > 3 * tau
    assert clipped.max() > tau  # the clip had work to do
    assert clipped.max() < 1.2 * tau
    assert clipped[-1] < 1.15 * tau


def test_attention_max_logits_is_the_layers_logits():
    attn = _attention(use_query_bias=True, use_key_bias=True)
    x = jax.random.normal(jax.random.key(3), (SEQ, DIM))
    q = (x @ attn.query_proj.weight.T + attn.query_proj.bias[None]).reshape(
        SEQ, HEADS, -1
    )
    k = (x @ attn.key_proj.weight.T + attn.key_proj.bias[None]).reshape(SEQ, HEADS, -1)
    logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
    got = eqopt.contrib.attention_max_logits(attn, x, x)
    np.testing.assert_allclose(got, logits.max(axis=(1, 2)), rtol=1e-5)
    mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    masked = eqopt.contrib.attention_max_logits(attn, x, x, mask=mask)
    expected = np.where(np.asarray(mask)[None], logits, -np.inf).max(axis=(1, 2))
    np.testing.assert_allclose(masked, expected, rtol=1e-5)
    # No gradient flows through it.
    grads = jax.grad(lambda a: eqopt.contrib.attention_max_logits(a, x, x).sum())(
        eqx.filter(attn, eqx.is_inexact_array)
    )
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads))


def test_clip_rescales_the_heads_rows_and_biases():
    """Head 0 (logit 4, tau 1) gets sqrt(1/4) on its query and key rows (weights and
    biases); head 1 (logit 0.5) is left exactly as the inner update leaves it."""
    attn = _attention(use_query_bias=True, use_key_bias=True)
    params = eqx.filter(attn, eqx.is_inexact_array)
    updates = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), params)
    tx = eqopt.contrib.qk_clip(1.0, alpha=0.25)
    out, _ = tx.update(
        updates, tx.init(params), params, max_logits=jnp.array([4.0, 0.5])
    )
    half = DIM // HEADS
    for name, exponent in (("query_proj", 0.25), ("key_proj", 0.75)):
        for field in ("weight", "bias"):
            p = getattr(getattr(params, name), field)
            u = getattr(getattr(out, name), field)
            np.testing.assert_allclose(
                (p + u)[:half], (p + 0.1)[:half] * 0.25**exponent, rtol=1e-5, atol=1e-6
            )
            assert np.array_equal(u[half:], jnp.full_like(u[half:], 0.1))
    assert out.value_proj.weight is not None
    assert np.array_equal(out.value_proj.weight, updates.value_proj.weight)


def test_stacked_attention_is_its_layers():
    """A stack of two attentions (`eqx.filter_vmap`) with `(L, heads)` logits gets,
    slice by slice, the list's updates with one `(heads,)` array per layer."""
    stacked = eqx.filter_vmap(lambda k: eqx.nn.MultiheadAttention(HEADS, DIM, key=k))(
        jax.random.split(jax.random.key(0), 2)
    )

    def layer(tree, i):
        return jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, tree)

    listed = [layer(stacked, i) for i in range(2)]
    logits = jnp.array([[3.0, 0.2], [0.5, 8.0]])
    opt = eqopt.contrib.muon_clip(0.05, qk_clip_threshold=1.0)
    grads = jax.tree.map(
        lambda x: jnp.cos(jnp.arange(x.size, dtype=x.dtype)).reshape(x.shape),
        eqx.filter(stacked, eqx.is_inexact_array),
    )
    ours, _ = opt.update(grads, opt.init(stacked), stacked, max_logits=logits)
    list_grads = [layer(grads, i) for i in range(2)]
    theirs, _ = opt.update(
        list_grads, opt.init(listed), listed, max_logits=[logits[0], logits[1]]
    )
    for i in range(2):
        for a, b in zip(
            jax.tree.leaves(layer(ours, i)),
            jax.tree.leaves(theirs[i]),
            strict=True,
        ):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # The clip acted: slice 1's head 1 (logit 8) is shrunk, slice 0's head 1 not.
    q = stacked.query_proj.weight + ours.query_proj.weight
    assert float(jnp.linalg.norm(q[1, DIM // 2 :])) < 0.5 * float(
        jnp.linalg.norm(stacked.query_proj.weight[1, DIM // 2 :])
    )


def test_inside_param_groups():
    """A group's learning-rate multiplier reaches Muon; the clip follows it."""
    model = _Model(0)
    params = eqx.filter(model, eqx.is_inexact_array)
    grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size)).reshape(x.shape), params)
    logits = {"attn": jnp.array([4.0, 0.5])}
    plain = eqopt.contrib.muon_clip(1e-2, qk_clip_threshold=1.0)
    grouped = eqopt.param_groups(
        plain, [eqopt.Group(r"^out\.", name="head", lr_mult=0.25)]
    )
    u_plain, _ = plain.update(grads, plain.init(params), params, max_logits=logits)
    u_grouped, _ = grouped.update(
        grads, grouped.init(params), params, max_logits=logits
    )
    np.testing.assert_allclose(
        u_grouped.out.weight, 0.25 * u_plain.out.weight, rtol=1e-6
    )
    np.testing.assert_allclose(
        u_grouped.attn.query_proj.weight, u_plain.attn.query_proj.weight, rtol=1e-6
    )


def test_missing_or_misshapen_logits_name_the_leaf():
    model = _Model(0)
    params = eqx.filter(model, eqx.is_inexact_array)
    opt = eqopt.contrib.muon_clip(1e-2)
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"\.attn\.query_proj\.weight.*max_logits"):
        opt.update(params, state, params)
    with pytest.raises(ValueError, match=r"no logits for the attention attn"):
        opt.update(params, state, params, max_logits={"other": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(2,\)"):
        opt.update(params, state, params, max_logits={"attn": jnp.ones(3)})
    # Without attention, no logits are needed: Muon's updates.
    mlp = eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    clip = eqopt.contrib.muon_clip(1e-2)
    muon = eqopt.contrib.muon(1e-2, consistent_rms=0.2, nesterov=False)
    g = jax.tree.map(jnp.ones_like, eqx.filter(mlp, eqx.is_inexact_array))
    a, _ = clip.update(g, clip.init(mlp), mlp)
    b, _ = muon.update(g, muon.init(mlp), mlp)
    assert all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_muon_keywords_are_forwarded():
    opt = eqopt.contrib.muon_clip(
        1e-2, orthogonalization="gram", nesterov=True, qk_clip_alpha=0.3
    )
    muon_part = opt[0].transforms["muon"][0]
    assert muon_part.orthogonalization == "gram" and muon_part.nesterov
    assert opt[1].alpha == 0.3
    with pytest.raises(ValueError, match="alpha"):
        eqopt.contrib.qk_clip(alpha=1.5)
