"""Pure functions of boxes: geometry and the pairwise layout terms of the five papers.

Every pairwise function takes query geometry `[..., Q, G]` and key geometry
`[..., K, G]` and returns `[..., H, Q, K]` (or `[..., Q, K]` when the term does
not depend on the head), so it serves dense attention and ETC's blocked local
attention alike. Only numpy and jax are imported here (no scipy, no
matplotlib); the beta-skeleton graph lives in `flaxdoc.layout.graph` and is
imported from there.

| module | mechanism |
|---|---|
| `geometry` | centres, corners, page stacking, normalisation, ETC blocks |
| `rich` | FormNet Rich Attention |
| `polar` | DocPolarBERT distance / angle / 1D buckets and gathered logits |
| `gaussian` | LAGaBi Gaussian polar bias |
| `squircle` | Douzon et al. squircle / cross weights and cosFormer factors |
| `relative` | ETC relative ids, T5 buckets, LayoutLMv2/v3 2D buckets |
| `sine` | sinusoidal features (input of LSPE) |
"""

from flaxdoc.layout.gaussian import (box_corner, gaussian_polar_bias, init_gaussian_params,
                                     polar_coordinates)
from flaxdoc.layout.geometry import (box_centers, box_point, box_sizes, document_boxes,
                                     etc_block_indices, etc_key_blocks, etc_num_blocks,
                                     etc_query_blocks, normalize_boxes, pairwise_deltas,
                                     pairwise_distances, stack_pages)
from flaxdoc.layout.polar import (NUM_ANGLE_CODES, NUM_ANGLE_SECTORS8_CODES, angle_codes_released,
                                  angle_sectors8, bucketed_dot_logits, distance_buckets,
                                  distance_quantile_edges, pair_masks)
from flaxdoc.layout.relative import (etc_membership_ids, etc_relative_ids,
                                     etc_relative_vocab_size, layoutlmv2_2d_buckets,
                                     relative_position_buckets, t5_relative_buckets)
from flaxdoc.layout.rich import (rich_attention_logits, rich_axis_coordinates,
                                 rich_projection_scalars)
from flaxdoc.layout.sine import sine_features
from flaxdoc.layout.squircle import (cos_reweight_factors_1d, cross_factors_2d, cross_weight,
                                     log_weight_bias, squircle_factors_2d, squircle_weight)

__all__ = [
    # geometry
    "box_centers", "box_point", "box_sizes", "stack_pages", "normalize_boxes", "document_boxes",
    "pairwise_deltas", "pairwise_distances", "etc_num_blocks", "etc_block_indices",
    "etc_query_blocks", "etc_key_blocks",
    # rich
    "rich_projection_scalars", "rich_axis_coordinates", "rich_attention_logits",
    # polar
    "NUM_ANGLE_CODES", "NUM_ANGLE_SECTORS8_CODES", "pair_masks", "distance_quantile_edges",
    "distance_buckets", "angle_codes_released", "angle_sectors8", "bucketed_dot_logits",
    # gaussian
    "box_corner", "polar_coordinates", "gaussian_polar_bias", "init_gaussian_params",
    # squircle
    "squircle_weight", "cross_weight", "log_weight_bias", "cos_reweight_factors_1d",
    "squircle_factors_2d", "cross_factors_2d",
    # relative
    "etc_relative_ids", "etc_membership_ids", "etc_relative_vocab_size", "t5_relative_buckets",
    "relative_position_buckets", "layoutlmv2_2d_buckets",
    # sine
    "sine_features",
]
