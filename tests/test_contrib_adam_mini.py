"""Adam-mini (`eqopt.contrib.adam_mini`, `scale_by_adam_mini`, `AdamMiniBlocks`)
against pytorch-optimizer's AdamMini and the paper's block rules."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _oracles import import_oracle
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
    po = import_oracle("pytorch_optimizer", "pytorch-optimizer")
    torch = import_oracle("torch")
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
    """Adam-mini in numpy with one block per index of `block_axes[k]` (None: whole,
    "adam": Adam's per-coordinate second moment)."""
    m = {k: np.zeros_like(v) for k, v in grads[0].items()}
    v = {k: 0.0 for k in grads[0]}
    out = []
    for t, g in enumerate(grads, start=1):
        step = {}
        for k, gk in g.items():
            axis = block_axes[k]
            mean = (
                gk**2
                if axis == "adam"
                else np.mean(gk**2)
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


def test_default_blocks_of_bare_arrays():
    """Bare arrays of rank >= 2: one block per index of axis 0; vectors: one block;
    a leaf whose name contains "bias": Adam per coordinate (the authors' rule)."""
    shapes = {"linear": (6, 4), "embedding": (10, 3), "scale": (6,), "bias": (6,)}
    _, grads = random_problem(shapes, 5, seed=3)
    tx = eqopt.contrib.scale_by_adam_mini()
    state = tx.init(grads[0])
    assert state.nu["linear"].shape == (6,) and state.nu["embedding"].shape == (10,)
    assert state.nu["scale"].shape == () and state.nu["bias"].shape == (6,)
    expected = _paper_adam_mini(
        grads, {"linear": 0, "embedding": 0, "scale": None, "bias": "adam"}
    )
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


# ---------------------------------------------------------------------------
# The authors' rules (Zhang et al., Adam-mini v1.1, their published code) by name,
# on an Equinox model whose paths are the names.
# ---------------------------------------------------------------------------

WQK_NAMES = {"k_proj", "q_proj", "wq", "wk", "query", "key"}
ROW_NAMES = {"embed", "embd", "wte", "lm_head", "output", "final_layer"} | {
    "v_proj", "wv", "value", "o_proj", "wo", "attn.proj", "feed_forward", "linear",
    "mlp",
}  # fmt: skip


class _Block(eqx.Module):
    embedding: eqx.nn.Embedding
    attention: eqx.nn.MultiheadAttention
    norm: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP


def _block():
    keys = jax.random.split(jax.random.key(0), 3)
    return _Block(
        eqx.nn.Embedding(VOCAB, D, key=keys[0]),
        eqx.nn.MultiheadAttention(
            HEADS,
            D,
            use_query_bias=True,
            use_key_bias=True,
            use_value_bias=True,
            use_output_bias=True,
            key=keys[1],
        ),
        eqx.nn.LayerNorm(D),
        eqx.nn.MLP(D, D, 2 * D, 1, key=keys[2]),
    )


def _authors_adam_mini(names, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """`Adam_mini.step` in numpy float64, routed by name as the authors do: "bias"
    to Adam, queries and keys by head (`dim * dim / n_heads` entries each), the
    embedding, output, value, projection and MLP weights by row, the rest (norms)
    one block. Returns the updates (before the learning rate's sign) per step."""
    head_numel = D * D // HEADS
    m = {n: 0.0 for n in names}
    v = {n: 0.0 for n in names}
    out = []
    for t, g in enumerate(grads, start=1):
        step = {}
        for name in names:
            gk = np.asarray(g[name], np.float64)
            if "bias" in name:
                square = gk * gk
            elif any(key in name for key in WQK_NAMES):
                heads = gk.reshape(-1, head_numel)
                square = np.repeat(np.mean(heads * heads, axis=1), head_numel)
                square = square.reshape(gk.shape)
            elif any(key in name for key in ROW_NAMES):
                square = np.mean(gk * gk, axis=1, keepdims=True)
            else:
                square = np.sum(gk * gk) / gk.size
            m[name] = m[name] + (1 - b1) * (gk - m[name])
            v[name] = b2 * v[name] + (1 - b2) * square
            h = np.sqrt(v[name]) / np.sqrt(1 - b2**t) + eps
            step[name] = -lr * (m[name] / (1 - b1**t)) / h
        out.append(step)
    return out


def _named(tree):
    from eqopt._leaves import path_str

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {path_str(path).lower().lstrip("."): leaf for path, leaf in flat}


@pytest.mark.parametrize("rule", ["default", "by rank"])
def test_default_blocks_on_an_equinox_model_are_the_authors(rule):
    """The default on an Equinox model routes as the authors' code does: biases (the
    LayerNorm's too) per coordinate, queries and keys by head, embedding, values,
    output and MLP weights by row, the LayerNorm scale one block. The rank rule
    alone (the old default) gives the biases one value: far from theirs."""
    model = _block()
    params = eqx.filter(model, eqx.is_inexact_array)
    blocks = None if rule == "default" else AdamMiniBlocks.default
    opt = eqopt.contrib.adam_mini(1e-2, weight_decay=0.0, blocks=blocks)
    state = opt.init(model)
    rng = np.random.default_rng(0)
    grads = [
        jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
        for _ in range(5)
    ]
    ours = []
    for g in grads:
        updates, state = opt.update(g, state, model)
        ours.append(_named(updates))
    names = list(_named(params))
    assert "attention.query_proj.weight" in names and "norm.bias" in names
    theirs = _authors_adam_mini(names, [_named(g) for g in grads], lr=1e-2)
    worst = max(
        np.max(np.abs(np.asarray(ours_step[n]) - their_step[n]) / 1e-2)
        for ours_step, their_step in zip(ours, theirs, strict=True)
        for n in names
    )
    if rule == "default":
        assert worst < 1e-4
        nu = state[0].nu
        assert nu.attention.query_proj.weight.shape == (HEADS,)
        assert nu.attention.value_proj.weight.shape == (D,)
        assert nu.embedding.weight.shape == (VOCAB,)
        assert nu.norm.weight.shape == () and nu.norm.bias.shape == (D,)
        assert nu.mlp.layers[0].bias.shape == (2 * D,)
    else:
        assert worst > 0.1


def test_default_tree_is_a_spec_to_edit():
    model = _block()
    blocks = AdamMiniBlocks.default_tree(model)
    assert blocks.mlp.layers[0].weight == AdamMiniBlocks(axis=0)
    assert blocks.mlp.layers[0].bias is False and blocks.mlp.activation is None
    assert blocks.attention.key_proj.weight == AdamMiniBlocks(axis=0, heads=HEADS)
    blocks = eqx.tree_at(lambda b: b.norm.weight, blocks, False)
    state = eqopt.contrib.adam_mini(1e-3, blocks=blocks).init(model)
    assert state[0].nu.norm.weight.shape == (D,)
