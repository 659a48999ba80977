"""MuonClip: Muon, then QK-clip of the attention heads whose logits grew past a threshold."""

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._base import AbstractGradientTransformation, EmptyState, Params, Updates
from .._combine import Chain
from .._entry import init_entry, update_entry
from .._hyper import (
    Scalar,
    ScalarLike,
    ScalarOrSchedule,
    as_scalar,
    check_hyperparameter,
)
from .._layer_axes import stack_axes
from .._leafwise import per_slice, require_params
from .._leaves import InputError, is_none, path_str
from .._typecheck import checked
from ._muon import muon

AttentionName = str | int | tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class QKClipProjection:
    """Marks a bare array as the query or key projection of an attention layer.

    An `eqx.nn.MultiheadAttention` needs none of this: its `query_proj` and
    `key_proj` (weights and biases) and its number of heads are read from the
    layer. For a custom attention, put one of these at each projection leaf of
    the `qk_clip_spec` of `eqopt.contrib.muon_clip` (a prefix pytree of the
    params, `None` elsewhere). The heads are contiguous, equal groups of the
    output axis (as `x @ W` then `reshape(seq, heads, head_dim)` makes them).

    Like `eqopt.contrib.MuonDimensionNumbers`, this is a frozen dataclass: a
    single pytree leaf, so it can sit in a spec next to `None`s.

    **Arguments:**

    - `role`: `"query"` or `"key"`.
    - `heads`: the number of heads.
    - `attention`: the name of the attention layer, the key of its maximum
      logits in `max_logits` (a string, or a tuple of keys for a nested dict
      or list: `("blocks", 0)` is `max_logits["blocks"][0]`).
    - `output_axis`: the output axis of one layer's leaf (default: the last,
      as a Flax `(in, out)` kernel or a bias; `0` for a PyTorch `(out, in)`
      weight).
    """

    role: Literal["query", "key"]
    heads: int
    attention: AttentionName
    output_axis: int = -1

    def __post_init__(self):
        if self.role not in ("query", "key"):
            raise ValueError(
                f"QKClipProjection: `role` must be 'query' or 'key', got {self.role!r}."
            )
        if not isinstance(self.heads, int) or self.heads < 1:
            raise ValueError(
                f"QKClipProjection: `heads` must be a positive int, got {self.heads!r}."
            )


@dataclasses.dataclass(frozen=True)
class _Target:
    """One leaf that QK-clip rescales, with what it needs to know."""

    index: int
    path: str
    role: str
    heads: int
    attention: tuple
    output_axis: int


def _key_name(key: Any) -> Any:
    for field in ("name", "key", "idx"):
        if hasattr(key, field):
            return getattr(key, field)
    return str(key)


def _names(path: tuple) -> tuple:
    return tuple(_key_name(key) for key in path)


def _is_attention(x: Any) -> bool:
    return x is None or isinstance(x, eqx.nn.MultiheadAttention)


def _targets(tree: Any, spec: Any) -> list[_Target]:
    """The query and key leaves of `tree`: of each `eqx.nn.MultiheadAttention`
    found in it, and those `spec` annotates (the spec wins)."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    index_of = {path: i for i, (path, _) in enumerate(flat)}
    found: dict[int, _Target] = {}
    for path, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_attention)[
        0
    ]:
        if not isinstance(node, eqx.nn.MultiheadAttention):
            continue
        for projection, role in (("query_proj", "query"), ("key_proj", "key")):
            for field in ("weight", "bias"):
                full = (
                    *path,
                    jax.tree_util.GetAttrKey(projection),
                    jax.tree_util.GetAttrKey(field),
                )
                if full in index_of:
                    # Weight `(out, in)`, bias `(out,)`: the output axis is 0.
                    found[index_of[full]] = _Target(
                        index_of[full],
                        path_str(full),
                        role,
                        node.num_heads,
                        _names(path),
                        0,
                    )
    if spec is None:
        return sorted(found.values(), key=lambda t: t.index)

    def is_spec_leaf(x):
        return x is None or isinstance(x, (bool, QKClipProjection))

    spec_flat, spec_def = jax.tree_util.tree_flatten_with_path(
        spec, is_leaf=is_spec_leaf
    )
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        raise InputError(
            "MuonClip: `qk_clip_spec` is not a prefix of the params' structure: build "
            "it with `jax.tree.map(lambda _: None, params)` and `eqx.tree_at`."
        ) from None
    for (prefix, value), subtree in zip(spec_flat, subtrees, strict=True):
        if not isinstance(value, QKClipProjection):
            continue
        for path, _ in jax.tree_util.tree_flatten_with_path(subtree, is_leaf=is_none)[
            0
        ]:
            full = prefix + path
            name = value.attention
            name = name if isinstance(name, tuple) else (name,)
            found[index_of[full]] = _Target(
                index_of[full],
                path_str(full),
                value.role,
                value.heads,
                name,
                value.output_axis,
            )
    return sorted(found.values(), key=lambda t: t.index)


def _logits_by_name(max_logits: Any) -> dict[tuple, Any]:
    flat = jax.tree_util.tree_flatten_with_path(max_logits)[0]
    return {_names(path): leaf for path, leaf in flat}


@no_type_check
def _clip_one(u, p, logits, *, role, heads, output_axis, threshold, alpha, path):
    """The clipped update of one layer's projection leaf: `(p + u) s - p` on each
    head's rows, written `s u + (s - 1) p` so that `s = 1` gives `u` exactly."""
    axis = output_axis % u.ndim
    if u.shape[axis] % heads:
        raise InputError(
            f"MuonClip: the leaf at {path} has {u.shape[axis]} outputs on axis {axis}, "
            f"not divisible by its {heads} heads."
        )
    logits = logits.astype(jnp.float32)
    gamma = threshold / jnp.maximum(logits, threshold)
    exponent = alpha if role == "query" else 1 - alpha
    scale = jnp.repeat(gamma**exponent, u.shape[axis] // heads)
    shape = [1] * u.ndim
    shape[axis] = u.shape[axis]
    scale = scale.reshape(shape).astype(u.dtype)
    return scale * u + (scale - 1) * p.astype(u.dtype)


@checked
class QKClip(AbstractGradientTransformation):
    r"""Rescales the query and key projections of attention heads whose logits exceeded $\tau$ (QK-clip).

    For each attention head $h$ whose largest pre-softmax logit in the step,
    $S^h_{\max} = \max_{i,j} q^h_i \cdot k^h_j / \sqrt{d}$, exceeded the
    threshold $\tau$, the parameters after the step are shrunk so that the
    logit falls back to $\tau$:

    $$
    \gamma_h = \min\!\Big(1, \frac{\tau}{S^h_{\max}}\Big), \qquad
    W_q^h \leftarrow \gamma_h^{\alpha}\, W_q^h, \qquad
    W_k^h \leftarrow \gamma_h^{1-\alpha}\, W_k^h .
    $$

    A transform returns updates, so the rescaling of the stepped parameters
    $p + u$ is written as an update on those rows:
    $u' = \gamma^{e} u + (\gamma^{e} - 1)\, p$ (that is, $(p + u)\gamma^{e} - p$;
    exactly $u$ for a head that is not clipped). It goes last in a chain,
    after the learning rate (`eqopt.contrib.muon_clip` puts it there).

    **Which leaves.** The query and key projections (weight and bias) of every
    `eqx.nn.MultiheadAttention` in the params, with its `num_heads`; heads are
    contiguous groups of the output axis, as the layer reshapes them. Bare
    arrays and custom attentions are marked with
    `eqopt.contrib.QKClipProjection` in `spec`.

    **The logits** come from the forward pass of the step, as the extra
    argument `update(..., max_logits=...)`: a pytree with one array per
    attention layer, at the layer's path in the model (`{"attn": s}` for
    `model.attn`, `{"blocks": [s0, s1]}` for `model.blocks[0]` and `[1]`), or
    at the `attention` name of its `QKClipProjection`s; a bare array for a
    model that is one attention layer. Each array is `(heads,)`, or
    `(L, heads)` for a stack of `L` layers. Compute it with
    `eqopt.contrib.attention_max_logits`, reduced (`max`) over the batch and
    the data-parallel devices. When the params hold no attention, `update`
    passes the updates through and needs no logits.

    **Per layer**: on a layer stacked with `eqx.filter_vmap` it runs on each
    slice, batched, as on the list of those layers. Each slice of a stacked
    attention gets its own heads' factors, from its row of the `(L, heads)`
    logits.

    **Arguments:**

    - `threshold`: $\tau$.
    - `alpha`: $\alpha$, the query's share of the factor (the key's is
      $1 - \alpha$).
    - `spec`: `None`, or a prefix pytree of the params with
      `eqopt.contrib.QKClipProjection` at the query and key leaves of
      attentions that are not `eqx.nn.MultiheadAttention`s (`None`
      elsewhere); it wins where it names a leaf.

    **References:** Kimi Team, *Kimi K2: Open Agentic Intelligence*,
    arXiv:2507.20534, 2025 (Section 2.1, QK-Clip).
    """

    threshold: Scalar = eqx.field(default=100.0, converter=as_scalar)
    alpha: Scalar = eqx.field(default=0.5, converter=as_scalar)
    spec: Any = None

    def __check_init__(self):
        check_hyperparameter("threshold", self.threshold, low=0.0, low_inclusive=False)
        check_hyperparameter(
            "alpha", self.alpha, low=0.0, high=1.0, high_inclusive=True
        )

    @property
    def elementwise(self) -> bool:
        return False

    @init_entry
    def init(self, params: Params) -> EmptyState:
        _targets(params, self.spec)  # a bad spec fails here, not at the first step
        return EmptyState()

    @update_entry
    def update(
        self,
        updates: Updates,
        state: EmptyState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, EmptyState]:
        targets = _targets(updates if params is None else params, self.spec)
        if not targets:
            return updates, state
        require_params(params, "MuonClip (QK-clip)")
        max_logits = extra_args.get("max_logits")
        if max_logits is None:
            raise InputError(
                f"MuonClip: the attention at {targets[0].path} needs its logits: pass "
                "`update(..., max_logits=...)`, computed with "
                "`eqopt.contrib.attention_max_logits`."
            )
        table = _logits_by_name(max_logits)
        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_none)
        param_leaves = treedef.flatten_up_to(params)
        stacks = stack_axes(updates)
        for target in targets:
            u = leaves[target.index]
            if u is None:
                continue
            logits = table.get(target.attention)
            if logits is None:
                name = ".".join(str(n) for n in target.attention) or "(the root)"
                raise InputError(
                    f"MuonClip: `max_logits` has no logits for the attention {name} "
                    f"of the leaf at {target.path}."
                )
            stack = stacks[target.index]
            expected = (*u.shape[:stack], target.heads)
            if tuple(jnp.shape(logits)) != expected:
                raise InputError(
                    f"MuonClip: the max logits for the leaf at {target.path} have shape "
                    f"{tuple(jnp.shape(logits))}, expected {expected} (one per head"
                    f"{', per layer of the stack' if stack else ''})."
                )
            clip = per_slice(
                lambda u, p, s, target=target: _clip_one(
                    u,
                    p,
                    s,
                    role=target.role,
                    heads=target.heads,
                    output_axis=target.output_axis,
                    threshold=self.threshold,
                    alpha=self.alpha,
                    path=target.path,
                ),
                stack,
            )
            leaves[target.index] = clip(
                u, param_leaves[target.index], jnp.asarray(logits)
            )
        return jax.tree.unflatten(treedef, leaves), state


@checked
def qk_clip(
    threshold: ScalarLike = 100.0, alpha: ScalarLike = 0.5, spec: Any = None
) -> QKClip:
    """Functional spelling of `eqopt.contrib.QKClip`."""
    return QKClip(threshold=threshold, alpha=alpha, spec=spec)


@checked
def muon_clip(
    learning_rate: ScalarOrSchedule,
    *,
    qk_clip_threshold: ScalarLike = 100.0,
    qk_clip_alpha: ScalarLike = 0.5,
    qk_clip_spec: Any = None,
    **muon_kwargs: Any,
) -> Chain:
    r"""MuonClip: `eqopt.contrib.muon`, then QK-clip of the attention heads (Kimi K2).

    $$
    \begin{aligned}
    W_t &= W_{t-1} - \eta_t\big(0.2\sqrt{\max(n_{\text{in}}, n_{\text{out}})}\,
      \operatorname{NS}(M_t) + \lambda W_{t-1}\big), \qquad M_t = \mu M_{t-1} + G_t \\
    \gamma_h &= \min(1, \tau / S^h_{\max}), \qquad
    W_{q,t}^h \leftarrow \gamma_h^{\alpha} W_{q,t}^h, \qquad
    W_{k,t}^h \leftarrow \gamma_h^{1-\alpha} W_{k,t}^h
    \end{aligned}
    $$

    Muon's step is `eqopt.contrib.muon`'s (every keyword argument but the
    `qk_clip_*` ones is passed to it), then `eqopt.contrib.QKClip` rescales
    the query and key projections of each head whose largest logit
    $S^h_{\max}$ in the step exceeded $\tau$. The defaults follow the Kimi K2
    recipe where they differ from Muon's: `consistent_rms=0.2` (the update's
    RMS matched to AdamW's) and `nesterov=False`; pass them to change that.

    The logits come from the forward pass: give `update` the extra argument
    `max_logits`, one `(heads,)` array per attention layer at its path in the
    model (see `eqopt.contrib.QKClip`), computed with
    `eqopt.contrib.attention_max_logits`.

    !!! example

        ```python
        class Model(eqx.Module):
            attn: eqx.nn.MultiheadAttention

            def __call__(self, x):
                logits = eqopt.contrib.attention_max_logits(self.attn, x, x)
                return self.attn(x, x, x), {"attn": logits}

        model = Model(eqx.nn.MultiheadAttention(2, 8, key=jax.random.key(0)))
        opt = eqopt.contrib.muon_clip(0.02, qk_clip_threshold=50.0)
        state = opt.init(model)

        def loss_fn(model, x):
            y, logits = model(x)
            return jnp.mean(y**2), logits

        x = jnp.ones((4, 8))
        (loss, logits), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model, x)
        updates, state = opt.update(grads, state, model, max_logits=logits)
        model = eqopt.apply_updates(model, updates)
        ```

    **Arguments:**

    - `learning_rate`: $\eta$, as for `eqopt.contrib.muon`.
    - `qk_clip_threshold`: $\tau$.
    - `qk_clip_alpha`: $\alpha$, the query's share of the factor (0.5: the
      square root of $\gamma_h$ on each side, as the paper does).
    - `qk_clip_spec`: the query and key leaves of attentions that are not
      `eqx.nn.MultiheadAttention`s, as for `eqopt.contrib.QKClip`.
    - `**muon_kwargs`: every other argument of `eqopt.contrib.muon`.

    **Returns:** an `eqopt.Chain` of Muon's partition and `eqopt.contrib.QKClip`.

    **References:** Kimi Team, *Kimi K2: Open Agentic Intelligence*,
    arXiv:2507.20534, 2025; Liu et al., *Muon is Scalable for LLM Training*,
    arXiv:2502.16982, 2025.
    """
    muon_kwargs.setdefault("consistent_rms", 0.2)
    muon_kwargs.setdefault("nesterov", False)
    return Chain(
        muon(learning_rate, **muon_kwargs),
        QKClip(threshold=qk_clip_threshold, alpha=qk_clip_alpha, spec=qk_clip_spec),
    )


@checked
def attention_max_logits(
    attention: eqx.nn.MultiheadAttention,
    query: Float[Array, "q_seq q_size"],
    key_: Float[Array, "kv_seq k_size"],
    value: Float[Array, "kv_seq v_size"] | None = None,
    mask: Bool[ArrayLike, "q_seq kv_seq"]
    | Bool[ArrayLike, "num_heads q_seq kv_seq"]
    | None = None,
    *,
    process_heads: Callable | None = None,
) -> Float[Array, " num_heads"]:
    r"""The largest pre-softmax logit of each head of an `eqx.nn.MultiheadAttention` call.

    $$ S^h_{\max} = \max_{i, j} \frac{q^h_i \cdot k^h_j}{\sqrt{d}} $$

    over the unmasked pairs, with the layer's projections and head split and
    $d$ its `qk_size` (the logits the layer's softmax sees). Call it beside
    the layer in the forward pass and return the result as an auxiliary
    output; under `jax.vmap` over a batch, take `max` over the batch axis (and
    over the data-parallel devices) before passing it to
    `eqopt.contrib.muon_clip`'s `update(..., max_logits=...)`. In a scanned
    stack of layers, `lax.scan` stacks it to `(L, heads)`. No gradient flows
    through it.

    **Arguments:**

    - `attention`: the layer.
    - `query`, `key_`, `value`, `mask`, `process_heads`: as for the layer's
      call (`value` is only needed by `process_heads`; default `key_`).

    **Returns:** the maximum logit of each head, shape `(num_heads,)`.

    **References:** Kimi Team, *Kimi K2: Open Agentic Intelligence*,
    arXiv:2507.20534, 2025.
    """
    attention = jax.lax.stop_gradient(attention)
    heads = attention.num_heads

    def project(projection, x):
        out = jax.vmap(projection)(jax.lax.stop_gradient(x))
        return out.reshape(x.shape[0], heads, -1)

    q = project(attention.query_proj, query)
    k = project(attention.key_proj, key_)
    if process_heads is not None:
        v = project(attention.value_proj, key_ if value is None else value)
        q, k, _ = process_heads(q, k, v)
    q = q / math.sqrt(q.shape[-1])
    logits = jnp.einsum("qhd,khd->hqk", q, k)
    if mask is not None:
        mask = jnp.asarray(mask)
        mask = mask if mask.ndim == 3 else mask[None]
        logits = jnp.where(jnp.broadcast_to(mask, logits.shape), logits, -jnp.inf)
    return jnp.max(logits, axis=(1, 2))
