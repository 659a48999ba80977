"""Loss functions, spelled as `optax.losses`.

Every loss is a plain function with Optax's name, argument names, defaults and
numerics. None reduces over the batch unless Optax's does (`ntxent`,
`ranking_softmax_loss`, `multiclass_generalized_dice_loss`); reduce the result
yourself, e.g. with `.mean()`. Shapes and dtypes are checked by the jaxtyping
annotations at trace time: class-index labels are integers, distributions over
classes are floating, and inputs that should share a shape must have exactly the
same shape (no implicit broadcasting).

The losses differ from Optax on purpose only where Optax gives NaN or infinity
for well-defined inputs (probabilities of exactly 0 or 1, `-inf` logits,
`where` masks selecting nothing, batches with no positive pair), plus a handful
of cases each docstring names.
"""

from ._classification import (
    hinge_loss as hinge_loss,
    multiclass_hinge_loss as multiclass_hinge_loss,
    multiclass_perceptron_loss as multiclass_perceptron_loss,
    perceptron_loss as perceptron_loss,
    poly_loss_cross_entropy as poly_loss_cross_entropy,
    safe_softmax_cross_entropy as safe_softmax_cross_entropy,
    sigmoid_binary_cross_entropy as sigmoid_binary_cross_entropy,
    sigmoid_focal_loss as sigmoid_focal_loss,
    smooth_labels as smooth_labels,
    softmax_cross_entropy as softmax_cross_entropy,
    softmax_cross_entropy_with_integer_labels as softmax_cross_entropy_with_integer_labels,
)
from ._ctc import (
    ctc_loss as ctc_loss,
    ctc_loss_with_forward_probs as ctc_loss_with_forward_probs,
)
from ._divergence import (
    convex_kl_divergence as convex_kl_divergence,
    generalized_kl_divergence as generalized_kl_divergence,
    kl_divergence as kl_divergence,
    kl_divergence_with_log_targets as kl_divergence_with_log_targets,
)
from ._fenchel_young import (
    make_fenchel_young_loss as make_fenchel_young_loss,
    multiclass_sparsemax_loss as multiclass_sparsemax_loss,
    sparsemax_loss as sparsemax_loss,
)
from ._ranking import ranking_softmax_loss as ranking_softmax_loss
from ._regression import (
    cosine_distance as cosine_distance,
    cosine_similarity as cosine_similarity,
    huber_loss as huber_loss,
    l2_loss as l2_loss,
    log_cosh as log_cosh,
    squared_error as squared_error,
)
from ._segmentation import (
    binary_dice_loss as binary_dice_loss,
    dice_loss as dice_loss,
    multiclass_generalized_dice_loss as multiclass_generalized_dice_loss,
)
from ._self_supervised import (
    ntxent as ntxent,
    triplet_margin_loss as triplet_margin_loss,
)
