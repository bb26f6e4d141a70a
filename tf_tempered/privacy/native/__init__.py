# Copyright 2026 The tf_tempered Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Native (C++) TensorFlow ops for the CPU: the lowest layer of the engine (imports nothing of it).

* ``conv2d_group_kernel_grads``: each microbatch's Conv2D kernel gradient
  G_m = Σ_{e ∈ m} Σ_r a_r g_rᵀ and ‖G_m‖², the patches read straight from the image
  (cc/conv_kernel_grads.cc): several times faster per layer than the best TF-ops form,
  about the cost of the batch's ordinary filter gradient (docs/benchmarks.md).
  ``conv2d_clipped_kernel_sum``: the same products giving the norms, every layer's clip
  factors (from the other layers' norms) and the clipped sum Σ_m c_m·G_m in one pass
  (cc/conv_clipped_sum.cc), for the last layer whose norms are known.
* ``depthwise_kernel_grads``: a depthwise convolution's per-example kernel gradients,
  examples in parallel (cc/depthwise_kernel_grads.cc): where TF's only form folds the batch
  into channels of oneDNN's depthwise backprop-filter, several times slower.
* ``box_muller``: the DP noise of DPRandomness.box_muller from the same Philox bits in one
  pass over memory instead of eight, 2-3 times faster (cc/box_muller.cc,
  benchmarks/results/noise_native.md); equal to TF's ops to float32 rounding.
  ``box_muller_pieces`` writes the same values straight into each variable's noise.
* ``embedding_sq_norms``: each microbatch's Embedding gradient norm from its ids and output
  gradients, microbatches in parallel (cc/embedding_sq_norms.cc; TF's segment sum runs on
  one thread).
* ``scatter_rows``: an Embedding's clipped sum made dense, rows in parallel, tf.scatter_nd's
  values bit for bit (cc/scatter_rows.cc; TF's kernel runs on one thread).
* ``row_sq_norms``: the squared norm of each row of a matrix (materialized per-microbatch
  gradients) in one read and without the squared copy TF's square-then-sum holds
  (cc/row_sq_norms.cc).

Built at first use (:mod:`.library`; how long: docs/install.md), or ahead of time by
``python -m tf_tempered.privacy.native``. CPU only: on a GPU machine the handlers use TF
ops, as under XLA and with ``TF_TEMPERED_NATIVE=0``.
"""

from tf_tempered.privacy.native.library import (BUILD_MIN_VALUES, available, build,
                                                library_path, load, usable)
from tf_tempered.privacy.native.ops import (box_muller, box_muller_pieces,
                                            conv2d_clipped_kernel_sum,
                                            conv2d_group_kernel_grads, depthwise_kernel_grads,
                                            embedding_sq_norms, gru_sequence, lstm_sequence,
                                            row_sq_norms, scatter_rows)

__all__ = ["BUILD_MIN_VALUES", "available", "box_muller", "box_muller_pieces", "build",
           "conv2d_clipped_kernel_sum", "conv2d_group_kernel_grads", "depthwise_kernel_grads",
           "embedding_sq_norms", "gru_sequence", "library_path", "load", "lstm_sequence",
           "row_sq_norms", "scatter_rows", "usable"]
