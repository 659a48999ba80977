"""Training on several devices: the optimiser state follows each parameter's sharding.

Run on a laptop, this simulates 8 devices on the CPU. XLA reads the device count
once, when JAX starts, so the flag must be set *before* `jax` is imported:

    XLA_FLAGS=--xla_force_host_platform_device_count=8   # what this script sets

The script lays the devices out as a 2 x 4 mesh with axes `data` and `model`,
and shards an Equinox MLP the Megatron way: the first layer's weight matrix is
split by rows over `model`, the second by columns, the last is replicated; the
batch is split over `data`. Nothing about the optimiser changes:
`opt.init(model)` builds each moment with the sharding of its parameter, and the
usual `eqx.filter_jit` step keeps model and state sharded as they came in. It
prints, for every parameter, its sharding and those of Adam's two moments, checks
that one sharded step gives the same numbers as the unsharded step, trains for
a few hundred steps, and draws which device holds which block of each matrix.

The mesh is a `jax.sharding.Mesh`, whose axes are in JAX's automatic mode: the
compiler propagates the shardings of the inputs through the jitted step, so an
off-the-shelf Equinox MLP needs no annotations inside. (Recent JAX also has an
explicit mode, the default of `jax.make_mesh`, in which a matrix product over
a sharded dimension must be told its output sharding; `eqx.nn.Linear` does
not take one.)

    python examples/sharding.py --out sharding.png
    python examples/sharding.py --short     # the quick run the tests use

About 15 s on a 2-core CPU; `--short` (what the tests run) about 13 s,
most of it start-up and compilation.
"""

import os

# Before importing JAX: pretend the CPU is 8 devices (keep any other flags).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import argparse  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from tqdm import tqdm  # noqa: E402

import eqopt  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IN_SIZE, WIDTH, OUT_SIZE = 16, 64, 4


@eqx.filter_jit
def make_data(key, num_points: int = 512):
    x_key, w_key = jax.random.split(key)
    x = jax.random.normal(x_key, (num_points, IN_SIZE))
    w = jax.random.normal(w_key, (IN_SIZE, OUT_SIZE)) / jnp.sqrt(IN_SIZE)
    return x, jnp.tanh(x @ w) + 0.1 * jnp.sin(3 * x[:, :OUT_SIZE])


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit(donate="all-except-first")
def train_step(opt, model, state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, state = opt.update(grads, state, model)
    return eqopt.apply_updates(model, updates), state, loss


def shard_model(model, mesh):
    """Puts each array of the model on the mesh with its own `PartitionSpec`."""
    specs = jax.tree.map(lambda _: P(), eqx.filter(model, eqx.is_array))
    specs = eqx.tree_at(
        lambda m: (
            m.layers[0].weight,  # (64, 16): rows over `model`
            m.layers[0].bias,  # (64,): follows the rows
            m.layers[1].weight,  # (64, 64): columns over `model`
        ),
        specs,
        (P("model", None), P("model"), P(None, "model")),
    )
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
    arrays, static = eqx.partition(model, eqx.is_array)
    return eqx.combine(jax.device_put(arrays, shardings), static)


def spec_of(array) -> str:
    spec = array.sharding.spec if hasattr(array.sharding, "spec") else "one device"
    return str(spec)


def print_shardings(model, state):
    """Prints each parameter's sharding beside those of its two Adam moments."""
    adam = state.scale_by_adam
    paths = jax.tree_util.tree_flatten_with_path(eqx.filter(model, eqx.is_array))[0]
    print(f"{'parameter':19}{'shape':9}{'param':17}{'mu':17}{'nu'}")
    for (path, param), mu, nu in zip(
        paths, jax.tree.leaves(adam.mu), jax.tree.leaves(adam.nu), strict=True
    ):
        print(
            f"{jax.tree_util.keystr(path):19}{str(param.shape):9}"
            f"{spec_of(param):17}{spec_of(mu):17}{spec_of(nu):17}".rstrip()
        )


def state_follows(model, state) -> bool:
    """Whether every Adam moment has exactly its parameter's sharding."""
    adam = state.scale_by_adam
    same = jax.tree.map(
        lambda p, m, n: p.sharding == m.sharding == n.sharding,
        eqx.filter(model, eqx.is_array),
        adam.mu,
        adam.nu,
    )
    return all(jax.tree.leaves(same))


def max_difference(a, b):
    """The largest absolute difference between two pytrees' arrays (on the host)."""
    diffs = jax.tree.map(
        lambda u, v: float(np.max(np.abs(np.asarray(u) - np.asarray(v)))),
        eqx.filter(a, eqx.is_array),
        eqx.filter(b, eqx.is_array),
    )
    return max(jax.tree.leaves(diffs))


def draw_blocks(ax, array, title):
    """Draws the blocks of a matrix, each labelled with the devices that hold it."""
    rows, cols = array.shape
    holders = {}
    for shard in array.addressable_shards:
        index = tuple(
            (s.start or 0, s.stop or n)
            for s, n in zip(shard.index, array.shape, strict=True)
        )
        holders.setdefault(index, []).append(shard.device.id)
    colours = plt.cm.tab10(np.linspace(0, 1, 10))
    for k, (((r0, r1), (c0, c1)), devices) in enumerate(sorted(holders.items())):
        ax.add_patch(
            Rectangle((c0, r0), c1 - c0, r1 - r0, color=colours[k % 10], alpha=0.5)
        )
        label = (
            "all devices"
            if len(devices) == len(jax.devices())
            else "devices\n" + ", ".join(map(str, sorted(devices)))
        )
        ax.text(
            (c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center", fontsize=10
        )
    ax.set(xlim=(0, cols), ylim=(rows, 0), title=title, xticks=[], yticks=[])
    ax.set_aspect("auto")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="sharding.png", help="plot file")
    parser.add_argument("--short", action="store_true", help="a quick run for CI")
    args = parser.parse_args()
    if args.short:
        args.steps = 20

    print(f"{jax.device_count()} devices ({jax.default_backend()})")
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    x, y = jax.device_get(make_data(data_key))  # on the host, like a data loader's
    model = eqx.nn.MLP(IN_SIZE, OUT_SIZE, WIDTH, 2, activation=jnp.tanh, key=model_key)
    opt = eqopt.adam(1e-2)

    # The reference: one step on a single device, from a copy (`train_step`
    # donates its inputs' buffers).
    copy = jax.tree.map(lambda a: a.copy() if eqx.is_array(a) else a, model)
    single_model, single_state, _ = train_step(
        opt, copy, opt.init(copy), x[:64], y[:64]
    )

    model = shard_model(model, mesh)
    # Each batch is split over `data`: 32 examples on each half of the mesh.
    batch_sharding = NamedSharding(mesh, P("data"))
    layout = jax.tree.map(lambda a: a.sharding, eqx.filter(model, eqx.is_array))
    state = opt.init(model)  # the whole (sharded) model, nothing else
    print_shardings(model, state)
    print(f"every moment has its parameter's sharding: {state_follows(model, state)}")

    batch = jax.device_put((x[:64], y[:64]), batch_sharding)
    model, state, loss = train_step(opt, model, state, *batch)
    difference = max(
        max_difference(model, single_model), max_difference(state, single_state)
    )
    print(f"one step, max |sharded - single device|: {difference:.1e}")
    print(f"one step matches the unsharded step: {difference < 1e-5}")

    losses = [float(loss)]
    bar = tqdm(range(1, args.steps), desc="training on 8 devices", unit="step")
    for i in bar:
        indices = np.random.default_rng(i).choice(len(x), 64, replace=False)
        batch = jax.device_put((x[indices], y[indices]), batch_sharding)
        model, state, loss = train_step(opt, model, state, *batch)
        losses.append(float(loss))
    kept = all(
        jax.tree.leaves(
            jax.tree.map(
                lambda p, s: p.sharding == s,
                eqx.filter(model, eqx.is_array),
                layout,
            )
        )
    )
    print(f"after {args.steps} steps, parameters kept their shardings: {kept}")
    print(
        f"after {args.steps} steps, every moment still has its parameter's sharding: "
        f"{state_follows(model, state)}"
    )
    print(f"final loss: {losses[-1]:.4f} (first {losses[0]:.4f})")

    fig, axes = plt.subplots(2, 3, figsize=(11, 6))
    adam = state.scale_by_adam
    for j, layer in enumerate(model.layers):
        draw_blocks(
            axes[0, j], layer.weight, f"layers[{j}].weight {layer.weight.shape}"
        )
        draw_blocks(
            axes[1, j], adam.mu.layers[j].weight, f"Adam mu for layers[{j}].weight"
        )
    fig.suptitle("Which devices hold each block (parameter above, its moment below)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"saved plot to {args.out}")


if __name__ == "__main__":
    main()
