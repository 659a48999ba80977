"""Which Equinox layer each leaf belongs to (`eqopt._layer_axes`), read from a model
or from its gradients."""

import equinox as eqx
import jax
import jax.numpy as jnp

import eqopt
from eqopt._layer_axes import LayerLeaf, layer_leaves
from eqopt._leaves import path_str


class _Net(eqx.Module):
    mlp: eqx.nn.MLP
    attention: eqx.nn.MultiheadAttention
    conv: eqx.nn.Conv2d
    transposed: eqx.nn.ConvTranspose1d
    embedding: eqx.nn.Embedding
    norm: eqx.nn.LayerNorm
    cell: eqx.nn.GRUCell
    bare: jax.Array


def _net():
    keys = jax.random.split(jax.random.key(0), 6)
    return _Net(
        eqx.nn.MLP(3, 2, 4, 1, key=keys[0]),
        eqx.nn.MultiheadAttention(2, 8, use_query_bias=True, key=keys[1]),
        eqx.nn.Conv2d(3, 5, (2, 4), key=keys[2]),
        eqx.nn.ConvTranspose1d(3, 6, 2, groups=3, key=keys[3]),
        eqx.nn.Embedding(10, 4, key=keys[4]),
        eqx.nn.LayerNorm(4),
        eqx.nn.GRUCell(3, 4, key=keys[5]),
        jnp.ones((3, 3)),
    )


def _by_name(tree):
    return {path_str(path): leaf for path, leaf in layer_leaves(tree).items()}


def test_each_layer_gives_its_input_and_output_axes():
    found = _by_name(_net())
    linear = found[".mlp.layers[0].weight"]
    assert (linear.layer, linear.input_axes, linear.output_axes) == (
        eqx.nn.Linear,
        (1,),
        (0,),
    )
    assert found[".mlp.layers[0].bias"] == LayerLeaf(eqx.nn.Linear, "bias")
    assert found[".mlp.layers[0].bias"].stack_axes == 0
    assert found[".attention.query_proj.weight"].heads == 2
    assert found[".attention.key_proj.weight"].heads == 2
    assert found[".attention.value_proj.weight"].heads is None
    assert found[".attention.query_proj.bias"].field == "bias"
    # Convolutions, transposed ones included, are stored (out, in // groups, *kernel).
    assert found[".conv.weight"].input_axes == (1, 2, 3)
    assert found[".transposed.weight"].output_axes == (0,)
    assert found[".transposed.weight"].input_axes == (1, 2)
    # An embedding takes tokens in and gives features out.
    embedding = found[".embedding.weight"]
    assert (embedding.input_axes, embedding.output_axes) == ((0,), (1,))
    assert found[".norm.weight"].is_normalisation
    assert not found[".norm.weight"].is_matrix
    assert found[".cell.weight_hh"].output_axes == (0,)
    assert ".bare" not in found  # a bare array keeps Optax's convention


def test_gradients_carry_the_layers():
    net = _net()
    grads = eqx.filter_grad(lambda n: jnp.sum(n.mlp(jnp.ones(3))))(net)
    assert _by_name(grads) == _by_name(net)
    # A leaf that is not differentiated (`None`) is not described.
    partial = eqx.filter(grads, lambda x: eqx.is_array(x) and x.ndim == 2)
    assert ".mlp.layers[0].bias" not in _by_name(partial)
    assert ".mlp.layers[0].weight" in _by_name(partial)


def test_the_paths_are_those_of_a_flattened_tree():
    net = _net()
    paths = {
        path for path, _ in jax.tree_util.tree_flatten_with_path(net, is_leaf=None)[0]
    }
    assert set(layer_leaves(net)) <= paths


def test_a_stack_of_layers_is_a_batch_of_matrices():
    """Layers stacked with `eqx.filter_vmap` (a scanned block): the leading axis is
    a stack axis, the input and output axes are those of one slice, and Muon
    orthogonalises each layer's matrix alone."""
    keys = jax.random.split(jax.random.key(0), 3)
    stacked = eqx.filter_vmap(lambda k: eqx.nn.Linear(8, 16, key=k))(keys)
    convs = eqx.filter_vmap(lambda k: eqx.nn.Conv2d(2, 4, 3, key=k))(keys)
    found = _by_name({"linear": stacked, "conv": convs})
    assert found["['linear'].weight"].input_axes == (1,)
    assert found["['linear'].weight"].output_axes == (0,)
    assert found["['linear'].weight"].stack_axes == 1
    assert found["['conv'].weight"].input_axes == (1, 2, 3)
    assert found["['conv'].weight"].output_axes == (0,)
    assert found["['conv'].weight"].stack_axes == 1
    assert found["['conv'].bias"].stack_axes == 1
    assert not found["['linear'].bias"].is_matrix
    assert found["['linear'].bias"].stack_axes == 1

    grads = jax.tree.map(
        lambda x: jnp.sin(jnp.arange(x.size, dtype=x.dtype)).reshape(x.shape), stacked
    )
    opt = eqopt.contrib.scale_by_muon(weight_dimension_numbers=lambda x: x.ndim >= 2)
    updates, _ = opt.update(grads, opt.init(stacked), stacked)
    for i in range(3):
        one = jax.tree.map(lambda x, i=i: x[i], (grads, stacked))
        alone, _ = opt.update(one[0], opt.init(one[1]), one[1])
        assert jnp.array_equal(updates.weight[i], alone.weight)
