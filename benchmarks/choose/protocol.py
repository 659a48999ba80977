"""The protocol: one cell (optimiser x workload) is a learning-rate sweep over seeds,
vmapped into one compiled program; then the time-to-target rules.

A run is a pure function of its peak learning rate and its seed: the model is
initialised from the seed, the optimiser is built from the rate *inside* the
vmapped function (so its rate leaves are traced arrays with a batch axis), and
the batches are drawn from the seed inside the program. All `lrs x seeds` runs
of a cell then train side by side in one `eqx.filter_vmap`-ed, jitted chunk of
`eval_every` steps (a `lax.scan`), which returns each run's validation metric.
An optimiser that cannot be vmapped falls back to one run at a time (the
rate is still an array, so the program compiles once).
"""

import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqopt

from .optimizers import Context, Spec, learning_rate
from .workloads import Workload

_BATCHED = eqx.if_array(0)


def state_bytes(state) -> int:
    """Bytes of every array leaf of an optimiser state."""
    leaves = jax.tree.leaves(eqx.filter(state, eqx.is_array))
    return int(sum(x.size * x.dtype.itemsize for x in leaves))


def make_init(workload: Workload, spec: Spec) -> Callable:
    """`init(peak_lr, seed) -> (opt, model, state, data_key)` for one run."""

    def init(peak, seed):
        model_key, data_key = jax.random.split(jax.random.key(seed))
        model = workload.init(model_key)

        def rate(scale):
            return learning_rate(spec, peak * scale, workload.steps)

        ctx = Context(model, workload.hidden(model), rate, workload.steps)
        opt = spec.factory(rate(1.0), ctx)
        return opt, model, opt.init(model), data_key

    return init


def make_chunk(workload: Workload, spec: Spec, length: int) -> Callable:
    """`chunk(opt, model, state, data_key, start)`: `length` steps of one run, then
    its validation metric; returns `(model, state, mean training loss, metric)`."""

    def chunk(opt, model, state, data_key, start):
        params, static = eqx.partition(model, eqx.is_array)

        def step(carry, i):
            params, state = carry
            model = eqx.combine(params, static)
            batch = workload.batch(data_key, start + i)

            def objective(m):
                return workload.loss(m, batch)

            loss, grads = eqx.filter_value_and_grad(objective)(model)
            if spec.extra_args:
                updates, state = opt.update(
                    grads, state, model, value=loss, grad=grads, value_fn=objective
                )
            else:
                updates, state = opt.update(grads, state, model)
            model = eqopt.apply_updates(model, updates)
            return (eqx.filter(model, eqx.is_array), state), loss

        (params, state), losses = jax.lax.scan(
            step, (params, state), jnp.arange(length)
        )
        model = eqx.combine(params, static)
        evaluated = spec.eval_params(state, model) if spec.eval_params else model
        return model, state, jnp.mean(losses), workload.evaluate(evaluated)

    return chunk


_PROGRAMS: dict = {}


def programs(workload, spec, length: int, vmapped: bool):
    """The jitted `(init, chunk, evaluate)` of a cell, vmapped or not; kept, so a
    second sweep of the same workload and optimiser does not compile again."""
    key = (id(workload), id(spec), length, vmapped)
    if key not in _PROGRAMS:
        init = make_init(workload, spec)
        chunk = make_chunk(workload, spec, length)
        evaluate = workload.evaluate
        if vmapped:
            init = eqx.filter_vmap(init)
            chunk = eqx.filter_vmap(chunk, in_axes=(_BATCHED,) * 4 + (None,))
            evaluate = eqx.filter_vmap(evaluate)
        jitted = tuple(eqx.filter_jit(f) for f in (init, chunk, evaluate))
        _PROGRAMS[key] = (workload, spec, jitted)  # holds the keys' objects alive
    return _PROGRAMS[key][2]


def forget_programs() -> None:
    """Drops the kept programs and JAX's compilation caches."""
    _PROGRAMS.clear()
    jax.clear_caches()


def sweep(workload, spec, lrs, seeds, vmapped: bool, progress):
    """Trains every (lr, seed) run; returns curves and timings."""
    run_lrs = np.repeat(np.asarray(lrs, np.float64), len(seeds))
    run_seeds = np.tile(np.asarray(seeds, np.uint32), len(lrs))
    init, chunk, evaluate = programs(workload, spec, workload.eval_every, vmapped)
    n_chunks = workload.steps // workload.eval_every
    if vmapped:
        groups = [np.arange(len(run_lrs))]
    else:
        groups = [np.asarray([i]) for i in range(len(run_lrs))]
    metric = np.zeros((len(run_lrs), n_chunks + 1))
    loss = np.full((len(run_lrs), n_chunks + 1), np.nan)
    seconds = []  # per call of `chunk`: the program's seconds per chunk
    compile_seconds = 0.0
    for group in groups:
        if vmapped:
            opt, model, state, key = init(
                jnp.asarray(run_lrs[group], jnp.float32), jnp.asarray(run_seeds[group])
            )
            metric[group, 0] = np.asarray(evaluate(model))
        else:
            (i,) = group
            opt, model, state, key = init(
                jnp.asarray(run_lrs[i], jnp.float32), jnp.asarray(run_seeds[i])
            )
            metric[i, 0] = float(evaluate(model))
        for c in range(n_chunks):
            start = time.perf_counter()
            model, state, mean_loss, value = chunk(
                opt, model, state, key, jnp.asarray(c * workload.eval_every)
            )
            value = np.asarray(value)  # waits for the chunk
            elapsed = time.perf_counter() - start
            if c == 0 and group is groups[0]:
                compile_seconds = elapsed
            else:
                seconds.append(elapsed)
            metric[group, c + 1] = value
            loss[group, c + 1] = np.asarray(mean_loss)
            progress(workload.eval_every * len(group))
    per_chunk = float(np.median(seconds)) if seconds else float("nan")
    program_step = per_chunk / workload.eval_every
    runs = [
        {"lr": float(lr), "seed": int(seed), "metric": m.tolist(), "loss": lo.tolist()}
        for lr, seed, m, lo in zip(run_lrs, run_seeds, metric, loss, strict=True)
    ]
    per_run = program_step / len(groups[0])
    return runs, compile_seconds, program_step, per_run


def time_single(workload, spec, lr, seed=0, chunks=3):
    """Seconds per step of one run (not vmapped), after its compilation, and the
    bytes of its optimiser state."""
    length = min(workload.eval_every, workload.steps)
    init, chunk, _ = programs(workload, spec, length, False)
    opt, model, state, key = init(jnp.asarray(lr, jnp.float32), jnp.asarray(seed))
    times = []
    for c in range(chunks):
        start = time.perf_counter()
        model, state, _, value = chunk(opt, model, state, key, jnp.asarray(c * length))
        np.asarray(value)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:])) / length, state_bytes(state)


def failures(runs) -> list[dict]:
    """Runs whose metric or loss went NaN/inf, or whose final training loss ended
    above twice its first chunk's (diverged)."""
    found = []
    for run in runs:
        metric, loss = np.asarray(run["metric"]), np.asarray(run["loss"][1:])
        bad = ~np.isfinite(metric[1:]) | ~np.isfinite(loss)
        if bad.any():
            kind, at = "nan", int(np.argmax(bad)) + 1
        elif loss[-1] > 2.0 * loss[0]:
            kind, at = "diverged", len(loss)
        else:
            continue
        found.append({"lr": run["lr"], "seed": run["seed"], "kind": kind, "chunk": at})
    return found


def run_cell(workload, spec, seeds, progress=lambda n: None, time_single_run=True):
    """The sweep of one cell: raw curves, timings, failures (no target needed)."""
    lrs = list(spec.lrs)
    start = time.perf_counter()
    mode, error = ("vmap", None) if workload.vmap else ("loop", "workload")
    try:
        runs, compile_s, program_step, per_run = sweep(
            workload, spec, lrs, seeds, workload.vmap, progress
        )
    except Exception as e:  # an optimiser that cannot be vmapped: one run at a time
        if not workload.vmap:
            raise
        mode, error = "loop", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        runs, compile_s, program_step, per_run = sweep(
            workload, spec, lrs, seeds, False, progress
        )
    if time_single_run:
        single_step, nbytes = time_single(workload, spec, lrs[len(lrs) // 2])
    else:
        single_step = per_run
        init = make_init(workload, spec)
        shapes = eqx.filter_eval_shape(init, jnp.float32(lrs[0]), jnp.uint32(0))
        nbytes = sum(
            x.size * x.dtype.itemsize
            for x in jax.tree.leaves(shapes[2])
            if hasattr(x, "dtype")
        )
    return {
        "mode": mode,
        "vmap_error": error,
        "lrs": lrs,
        "seeds": list(seeds),
        "eval_steps": [
            c * workload.eval_every
            for c in range(workload.steps // workload.eval_every + 1)
        ],
        "runs": runs,
        "compile_seconds": compile_s,
        "sweep_seconds_per_step": program_step,
        "sweep_seconds_per_step_per_run": per_run,
        "seconds_per_step": single_step,
        "state_bytes": int(nbytes),
        "failures": failures(runs),
        "wall_seconds": time.perf_counter() - start,
    }


# ---- the rules (AlgoPerf's): pure functions of the curves ----


def steps_to_target(eval_steps, metric, target) -> float:
    """The first evaluation step whose metric is at or below `target`; inf if none."""
    for step, value in zip(eval_steps, metric, strict=True):
        if np.isfinite(value) and value <= target:
            return float(step)
    return float("inf")


def target_of(cell, fraction=0.75) -> float:
    """The metric a tuned run of `cell` reaches at `fraction` of the budget: the
    setting with the best median-over-seeds final metric, its median over seeds
    at the evaluation step nearest `fraction * budget`."""
    steps = np.asarray(cell["eval_steps"])
    at = int(np.argmin(np.abs(steps - fraction * steps[-1])))
    by_lr = _by_lr(cell)
    best = min(by_lr, key=lambda lr: _nan_last(np.median(by_lr[lr][:, -1])))
    return float(np.median(by_lr[best][:, at]))


def _nan_last(x):
    return float(x) if np.isfinite(x) else float("inf")


def _by_lr(cell) -> dict[float, np.ndarray]:
    out: dict[float, list] = {}
    for run in cell["runs"]:
        out.setdefault(run["lr"], []).append(run["metric"])
    return {lr: np.asarray(v, float) for lr, v in out.items()}


def best_setting(cell, target) -> dict:
    """The AlgoPerf rule: the rate with the best median-over-seeds steps to target;
    if no rate reaches it, the best median final metric. Ties go to the final metric."""
    steps = cell["eval_steps"]
    rows = []
    for lr, curves in _by_lr(cell).items():
        reach = [steps_to_target(steps, m, target) for m in curves]
        final = np.median(curves[:, -1])
        rows.append((float(np.median(reach)), _nan_last(final), lr, reach))
    reached = [r for r in rows if np.isfinite(r[0])]
    pick = min(reached) if reached else min(rows, key=lambda r: (r[1], r[2]))
    median_steps, final, lr, reach = pick
    seconds = median_steps * cell["seconds_per_step"]
    return {
        "target": target,
        "lr": lr,
        "steps_to_target": median_steps,
        "steps_to_target_per_seed": reach,
        "seconds_to_target": seconds,
        "final_metric": final,
        "reached": bool(np.isfinite(median_steps)),
    }
