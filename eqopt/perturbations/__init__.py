"""Differentiable approximations of functions by random perturbations of their
inputs (Optax's `optax.perturbations`)."""

from ._perturbed import (
    AbstractNoiseDistribution as AbstractNoiseDistribution,
    Gumbel as Gumbel,
    Normal as Normal,
    PerturbedFunction as PerturbedFunction,
    make_perturbed_fun as make_perturbed_fun,
)
