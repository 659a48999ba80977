"""Polar Express: the Newton–Schulz coefficients of Amsel et al. (2025) for Muon."""

from typing import no_type_check

from .._typecheck import checked

# Amsel, Persson, Musco & Gower (2025), Polar Express: the greedy minimax
# polynomials for singular values in [1e-3, 1] (their published table; the
# eighth is the fixed point, repeated for more iterations).
_POLAR_EXPRESS_TABLE = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
_POLAR_EXPRESS_SAFETY = 1.01


@checked
def polar_express_coefficients(steps: int = 5) -> tuple[tuple[float, ...], ...]:
    r"""The Polar Express coefficients for `steps` Newton–Schulz iterations of Muon.

    The paper's rows $(a_k, b_k, c_k)$ of the quintics
    $p_k(x) = a_k x + b_k x^3 + c_k x^5$, each (but the last, a fixed point)
    made safe against rounding by $p_k(x / 1.01)$, and the first also folding
    in the paper's normalisation $X_0 = M / (1.01\, \|M\|_F)$, so that after
    Muon's $X_0 = M / \|M\|_F$ the iteration is exactly the paper's. Past the
    table's eight rows the last is repeated. `ns_coeffs="polar_express"` is
    `polar_express_coefficients(5)`.

    **Arguments:**

    - `steps`: the number of iterations.

    **Returns:** a tuple of `steps` rows `(a, b, c)`, for `ns_coeffs`.

    **References:** Amsel, Persson, Musco & Gower, *The Polar Express: Optimal
    Matrix Sign Methods and Their Application to the Muon Algorithm*,
    arXiv:2505.16932, 2025.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be a positive int, got {steps!r}.")
    return _polar_express_rows(steps)


@no_type_check
def _polar_express_rows(steps):
    # Unchecked: the preset below is built at import time.
    safety = _POLAR_EXPRESS_SAFETY
    rows = [
        (a / safety, b / safety**3, c / safety**5)
        for a, b, c in _POLAR_EXPRESS_TABLE[:-1]
    ] + [_POLAR_EXPRESS_TABLE[-1]]
    rows = rows[:steps] + [rows[-1]] * max(0, steps - len(rows))
    a, b, c = rows[0]
    rows[0] = (a / safety, b / safety**3, c / safety**5)
    return tuple(rows)
