"""Euclidean projections onto convex sets, spelled as `optax.projections`.

Each function takes an array or a pytree (a whole Equinox model included; its
non-array leaves pass through) and treats all its array leaves together as one
vector.
"""

from ._projections import (
    projection_box as projection_box,
    projection_halfspace as projection_halfspace,
    projection_hypercube as projection_hypercube,
    projection_hyperplane as projection_hyperplane,
    projection_l1_ball as projection_l1_ball,
    projection_l1_sphere as projection_l1_sphere,
    projection_l2_ball as projection_l2_ball,
    projection_l2_sphere as projection_l2_sphere,
    projection_linf_ball as projection_linf_ball,
    projection_non_negative as projection_non_negative,
    projection_simplex as projection_simplex,
    projection_vector as projection_vector,
)
