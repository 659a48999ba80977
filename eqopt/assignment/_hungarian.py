"""The Hungarian algorithm for the linear assignment problem, as a jit-able JAX loop."""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Int, Real

from .._typecheck import checked


@jax.jit
def _solve(cost: Array) -> Array:
    """The optimal assignment of the rows of an `(n, m)` cost matrix, `n <= m`.

    Returns `assigned_row`, of shape `(m + 1,)`: `assigned_row[j]` is one plus the
    row matched to column `j - 1`, or zero where that column is left unmatched
    (entry 0 belongs to an auxiliary column).

    This is the shortest-augmenting-path form of the Kuhn-Munkres algorithm: rows
    are inserted one at a time; each insertion grows a Dijkstra-like tree of
    alternating paths on the reduced costs `cost[i, j] - u[i] - v[j]`, updating the
    dual potentials `u`, `v` so that the reduced costs stay non-negative and are
    zero on the matching, until a free column is reached; the path to it is then
    flipped. O(n^2 m) work in total.
    """
    n, m = cost.shape
    out_of_range = n + 1  # potential updates sent here are dropped
    inf = jnp.array(jnp.inf, cost.dtype)

    def insert_row(row, carry):
        row_potential, column_potential, assigned_row = carry
        assigned_row = assigned_row.at[0].set(row + 1)

        def grow_tree_cond(state):
            _, _, assigned_row, _, _, _, column = state
            return assigned_row[column] != 0

        def grow_tree(state):
            row_potential, column_potential, assigned_row, slack, used, via, column = (
                state
            )
            used = used.at[column].set(True)
            current_row = assigned_row[column]
            reduced = (
                cost[current_row - 1]
                - row_potential[current_row]
                - column_potential[1:]
            )
            free = ~used[1:]
            improves = free & (reduced < slack[1:])
            slack = slack.at[1:].set(jnp.where(improves, reduced, slack[1:]))
            via = via.at[1:].set(jnp.where(improves, column, via[1:]))
            free_slack = jnp.where(free, slack[1:], inf)
            next_column = jnp.argmin(free_slack) + 1
            delta = free_slack[next_column - 1]
            rows_in_tree = jnp.where(used, assigned_row, out_of_range)
            row_potential = row_potential.at[rows_in_tree].add(delta, mode="drop")
            column_potential = jnp.where(
                used, column_potential - delta, column_potential
            )
            slack = slack.at[1:].set(jnp.where(free, slack[1:] - delta, slack[1:]))
            return (
                row_potential,
                column_potential,
                assigned_row,
                slack,
                used,
                via,
                next_column,
            )

        state = (
            row_potential,
            column_potential,
            assigned_row,
            jnp.full(m + 1, inf),
            jnp.zeros(m + 1, bool),
            jnp.zeros(m + 1, jnp.int32),
            jnp.array(0, jnp.int32),
        )
        row_potential, column_potential, assigned_row, _, _, via, column = (
            lax.while_loop(grow_tree_cond, grow_tree, state)
        )

        def flip_path(state):
            assigned_row, column = state
            previous = via[column]
            return assigned_row.at[column].set(assigned_row[previous]), previous

        assigned_row, _ = lax.while_loop(
            lambda state: state[1] != 0, flip_path, (assigned_row, column)
        )
        return row_potential, column_potential, assigned_row

    init = (
        jnp.zeros(n + 1, cost.dtype),
        jnp.zeros(m + 1, cost.dtype),
        jnp.zeros(m + 1, jnp.int32),
    )
    _, _, assigned_row = lax.fori_loop(0, n, insert_row, init)
    return assigned_row


def _prepare(cost_matrix: ArrayLike) -> tuple[Array, bool]:
    cost = jnp.asarray(cost_matrix)
    cost = cost.astype(jnp.promote_types(cost.dtype, jnp.float32))
    transpose = cost.shape[0] > cost.shape[1]
    return (cost.T if transpose else cost), transpose


def _column_for_row(assigned_row: Array, n: int) -> Array:
    """Inverts `assigned_row` to the column matched to each of the `n` rows."""
    m = assigned_row.shape[0] - 1
    rows = jnp.where(assigned_row[1:] > 0, assigned_row[1:] - 1, n)
    return (
        jnp.zeros(n, jnp.int32)
        .at[rows]
        .set(jnp.arange(m, dtype=jnp.int32), mode="drop")
    )


def _empty() -> tuple[Array, Array]:
    return jnp.zeros(0, jnp.int32), jnp.zeros(0, jnp.int32)


@checked
def hungarian_algorithm(
    cost_matrix: Real[ArrayLike, "n m"],
) -> tuple[Int[Array, " k"], Int[Array, " k"]]:
    r"""Solves the linear assignment problem with the Hungarian algorithm.

    Given an $n \times m$ cost matrix $C$, finds

    $$ \min_{X \in \{0,1\}^{n \times m}} \sum_{i,j} C_{ij} X_{ij}
       \quad\text{s.t.}\quad \sum_j X_{ij} \le 1,\ \ \sum_i X_{ij} \le 1,\ \
       \sum_{i,j} X_{ij} = \min(n, m), $$

    a matching of $\min(n, m)$ rows to distinct columns of least total cost.
    Rectangular matrices are solved along their shorter side. The algorithm is
    the shortest-augmenting-path form of the Hungarian algorithm with dual
    potentials, $O(\min(n,m)^2 \max(n,m))$ operations, written with
    `lax.while_loop` so that it runs under `jax.jit` and `jax.vmap` (the shape of
    the matrix is static). Costs are promoted to at least `float32` and must be
    finite.

    **Arguments:**

    - `cost_matrix`: the $n \times m$ matrix of costs $C$.

    **Returns:** a pair `(i, j)` of integer index arrays of length $\min(n, m)$:
    row `i[k]` is matched to column `j[k]`, and the least cost is
    `cost_matrix[i, j].sum()`. The pairs come in Optax's order for this
    function: for a square matrix, by increasing column; otherwise by
    decreasing index along the shorter side. It is the same solver as
    `eqopt.assignment.base_hungarian_algorithm`; only the order differs.

    **References:** H. W. Kuhn, *The Hungarian method for the assignment
    problem*, Naval Research Logistics Quarterly 2, 1955; J. Munkres,
    *Algorithms for the assignment and transportation problems*, J. SIAM 5(1),
    1957; R. Jonker and A. Volgenant, *A shortest augmenting path algorithm for
    dense and sparse linear assignment problems*, Computing 38, 1987.

    !!! example

        ```python
        cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
        i, j = eqopt.assignment.hungarian_algorithm(cost)
        cost[i, j].sum()  # 15
        ```
    """
    cost, transpose = _prepare(cost_matrix)
    if cost.size == 0:
        return _empty()
    n = cost.shape[0]
    assigned_row = _solve(cost)
    if not transpose and n == cost.shape[1]:
        return assigned_row[1:] - 1, jnp.arange(n, dtype=jnp.int32)
    # Pairs in decreasing order of the shorter side's index, as Optax returns them.
    shorter = jnp.arange(n - 1, -1, -1, dtype=jnp.int32)
    longer = _column_for_row(assigned_row, n)[::-1]
    return (longer, shorter) if transpose else (shorter, longer)


@checked
def base_hungarian_algorithm(
    cost_matrix: Real[ArrayLike, "n m"],
) -> tuple[Int[Array, " k"], Int[Array, " k"]]:
    r"""Solves the linear assignment problem, returning the pairs sorted by row.

    The same problem and solver as `eqopt.assignment.hungarian_algorithm`
    (see there for the problem, the algorithm and its cost); only the order of
    the pairs differs.

    **Arguments:**

    - `cost_matrix`: the $n \times m$ matrix of costs $C$.

    **Returns:** a pair `(i, j)` of integer index arrays of length $\min(n, m)$:
    row `i[k]` is matched to column `j[k]`, and the least cost is
    `cost_matrix[i, j].sum()`. The pairs come sorted by increasing row, as in
    Optax.

    **References:** H. W. Kuhn, *The Hungarian method for the assignment
    problem*, Naval Research Logistics Quarterly 2, 1955; J. Munkres,
    *Algorithms for the assignment and transportation problems*, J. SIAM 5(1),
    1957; R. Jonker and A. Volgenant, *A shortest augmenting path algorithm for
    dense and sparse linear assignment problems*, Computing 38, 1987.
    """
    cost, transpose = _prepare(cost_matrix)
    if cost.size == 0:
        return _empty()
    n = cost.shape[0]
    columns = _column_for_row(_solve(cost), n)
    if not transpose:
        return jnp.arange(n, dtype=jnp.int32), columns
    # Here `columns[c]` is the row matched to column `c` of the original matrix.
    order = jnp.argsort(columns).astype(jnp.int32)
    return columns[order], order
