"""Adam-mini (`eqopt.contrib.adam_mini`, `scale_by_adam_mini`, `AdamMiniBlocks`)
against pytorch-optimizer's AdamMini and the paper's block rules."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch_oracle import eqopt_steps, max_difference, random_problem, torch_steps
from helpers import Case, make_model, spec_like

import eqopt
from eqopt.contrib import AdamMiniBlocks

ORACLE = "pytorch-optimizer's AdamMini, compared over several steps in this file"

TRANSFORM_CASES = [
    Case(
        "contrib.adam_mini",
        lambda: eqopt.contrib.adam_mini(1e-2, weight_decay=0.1),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.adam_mini-heads-and-adam",
        lambda p: eqopt.contrib.adam_mini(
            1e-2,
            blocks=spec_like(p, True, w=AdamMiniBlocks(axis=0, heads=2), b=False),
        ),
        None,
        no_parity_reason=ORACLE,
    ),
    Case(
        "contrib.scale_by_adam_mini-columns",
        lambda: eqopt.contrib.scale_by_adam_mini(
            blocks=lambda x: AdamMiniBlocks(axis=-1) if x.ndim == 2 else True
        ),
        None,
        no_parity_reason=ORACLE,
    ),
]

D, HEADS, VOCAB = 8, 2, 10
SHAPES = {"embed": (VOCAB, D), "q_proj": (D, D), "mlp": (2 * D, D), "norm": (D,)}


def test_adam_mini_matches_pytorch_optimizer():
    """pytorch-optimizer's rules (the authors' first release): embeddings per
    coordinate, queries by head, everything else one block per tensor, no weight
    decay on norms."""
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the Adam-mini oracle is pytorch-optimizer"
    )
    torch = pytest.importorskip("torch")
    params, grads = random_problem(SHAPES, 8)

    def make(tensors):
        model = torch.nn.Module()
        for name, tensor in tensors.items():
            part = torch.nn.Module()
            part.register_parameter("weight", tensor)
            model.add_module(name, part)
        return po.AdamMini(
            model,
            lr=1e-2,
            betas=(0.9, 0.99),
            weight_decay=0.1,
            num_embeds=D,
            num_heads=HEADS,
        )

    blocks = {
        "embed": False,
        "q_proj": AdamMiniBlocks(axis=0, heads=HEADS),
        "mlp": True,
        "norm": True,
    }
    ours = eqopt_steps(
        eqopt.contrib.adam_mini(
            1e-2,
            b2=0.99,
            weight_decay=0.1,
            blocks=blocks,
            mask={"embed": True, "q_proj": True, "mlp": True, "norm": False},
        ),
        params,
        grads,
    )
    theirs = torch_steps(make, params, grads)
    assert max_difference(ours, theirs) < 1e-5


def _paper_adam_mini(grads, block_axes, b1=0.9, b2=0.999, eps=1e-8):
    """Adam-mini in numpy with one block per index of `block_axes[k]` (None: whole)."""
    m = {k: np.zeros_like(v) for k, v in grads[0].items()}
    v = {k: 0.0 for k in grads[0]}
    out = []
    for t, g in enumerate(grads, start=1):
        step = {}
        for k, gk in g.items():
            axis = block_axes[k]
            mean = (
                np.mean(gk**2)
                if axis is None
                else np.mean(
                    gk**2,
                    axis=tuple(i for i in range(gk.ndim) if i != axis),
                    keepdims=True,
                )
            )
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * mean
            step[k] = (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps)
        out.append(step)
    return out


def test_default_blocks_are_the_papers_neurons_and_tokens():
    """Rank >= 2: one block per index of axis 0 (output neurons of an Equinox Linear,
    tokens of an Embedding); vectors: one block."""
    shapes = {"linear": (6, 4), "embedding": (10, 3), "bias": (6,)}
    _, grads = random_problem(shapes, 5, seed=3)
    tx = eqopt.contrib.scale_by_adam_mini()
    state = tx.init(grads[0])
    assert state.nu["linear"].shape == (6,) and state.nu["embedding"].shape == (10,)
    assert state.nu["bias"].shape == ()
    expected = _paper_adam_mini(grads, {"linear": 0, "embedding": 0, "bias": None})
    for g, want in zip(grads, expected, strict=True):
        got, state = tx.update(jax.tree.map(jnp.asarray, g), state)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6)


def test_heads_are_contiguous_rows():
    g = jnp.concatenate([jnp.full((2, 3), 1.0), jnp.full((2, 3), 3.0)])
    tx = eqopt.contrib.scale_by_adam_mini(b2=0.5, blocks=AdamMiniBlocks(0, heads=2))
    _, state = tx.update({"q": g}, tx.init({"q": g}))
    np.testing.assert_allclose(state.nu["q"], [0.5 * 1.0, 0.5 * 9.0])


def test_state_is_about_half_of_adams():
    params = {"w": jnp.zeros((64, 32)), "b": jnp.zeros(64)}

    def size(state):
        return sum(x.size for x in jax.tree.leaves(state) if eqx.is_array(x))

    mini = size(eqopt.contrib.adam_mini(1e-3).init(params))
    assert mini < 0.52 * size(eqopt.adamw(1e-3).init(params))


def test_bad_heads_names_the_leaf():
    tx = eqopt.contrib.scale_by_adam_mini(
        blocks=lambda x: AdamMiniBlocks(axis=0, heads=3) if x.ndim == 2 else True
    )
    with pytest.raises(ValueError, match=r"\.w.*3 heads"):
        tx.init(make_model())
    with pytest.raises(ValueError, match="heads"):
        AdamMiniBlocks(heads=2)
