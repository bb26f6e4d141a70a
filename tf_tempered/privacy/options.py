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
"""Public knobs of the DP engine: `make_private(model, options=EngineOptions(...))`.

The defaults are what the engine uses without options; the thresholds were set from
CPU measurements (docs/benchmarks.md, "Measurements behind the engine's defaults"; M is
the number of microbatches, "rows" the rows a_r of one microbatch: examples × output
pixels or positions).
The options change only how per-microbatch norms and clipped sums are computed,
never their values (every path is exact), so they are safe to tune for speed or
memory, and tests use them to exercise every path; ``noise`` picks the sampler of the
N(0, σ²C²) noise (same distribution, same ε; a hardened sampler costs more).
"""

import dataclasses
from typing import Optional, Union

from tf_tempered.privacy.native import library as native_library

__all__ = ["EngineOptions", "NORM_PATHS", "CLIPPED_SUMS", "NOISE_MODES"]

# "auto": each layer's handler picks by the measured cost rules below.
# "ghost" / "materialize": that TF-ops path for every Dense/Conv2D-like layer
# (the native op and the depthwise shortcut are then not used).
# "native": the native op for every Conv2D it supports (others: "auto").
# "depthwise": the depthwise-conv backprop for every undilated Conv2D with equal strides
# whatever its channel count (others: "auto" without the native op).
NORM_PATHS = ("auto", "ghost", "materialize", "native", "depthwise")
# How the clipped sum is formed once the clip factors are known (privacy/step/clipped_sum.py).
CLIPPED_SUMS = ("bookkeeping", "second_pass", "recompute")
# How the noise is drawn (privacy/randomness.py SAMPLERS; docs/randomness.md, "Hardened noise").
NOISE_MODES = ("gaussian", "sum_of_gaussians")
# The default Conv2D depthwise-backprop threshold where TF's CPU kernels are oneDNN's.
ONEDNN_DEPTHWISE_MAX_CHANNEL_PAIRS = 64


def _native_default():
    # TF_TEMPERED_NATIVE=0 (or false, off, no) turns the native ops off for every model, as
    # it keeps privacy/native from building them.
    return not native_library.switched_off()


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How the DP engine computes per-microbatch norms and clipped sums (never their values).

    Attributes:
      native: use the native ops (CPU, built at first use): the Conv2D op where it
        applies, the depthwise layers' op, the Embedding norm and row-scatter ops, and the
        Box–Muller op for the noise (the same normals to float32 rounding, 3.5x faster;
        compiled for the noise alone only from 10⁶ parameters).
        Default: True unless TF_TEMPERED_NATIVE=0; where the ops cannot be built (no
        compiler), on GPU machines and under XLA, TF ops are used.
      norm_path: "auto" (per-layer cost rules), or one path forced for every
        layer that can take it: "ghost", "materialize", "native", "depthwise".
      materialize_max_bytes: per-microbatch gradients of one layer are
        materialized only when they fit in this many bytes.
      depthwise_max_channel_pairs: a Conv2D with at most this many (input
        channel, output channel) pairs takes the depthwise-conv backprop
        (TF ops only, undilated); 0 turns that backprop off everywhere, also in
        DepthwiseConv2D/SeparableConv2D (image patches instead), as XLA steps do.
        None (default): 64 where TensorFlow's CPU kernels are oneDNN's, else 0 for
        Conv2D (`conv2d_depthwise_max_channel_pairs`); DepthwiseConv2D and
        SeparableConv2D keep it either way.
      conv_blocks: a strided, undilated Conv2D whose per-microbatch gradients are
        materialized from TF ops forms them from one product per block of stride×stride
        kernel offsets (no patch tensor) instead of image patches (TF's executor) or one
        product per offset (XLA). None (default): under TF's executor where its CPU kernels
        are not oneDNN's (where they are, the depthwise backprop or patches are faster;
        under XLA, the products per offset are as fast); True/False: wherever it applies
        / never.
      native_min_ghost_rows: in the native-op vs ghost-norm cost comparison a
        microbatch counts at least this many rows.
      native_materialize_min_rows: with the native op, a Conv2D with at least
        this many rows per microbatch keeps its per-microbatch gradients.
      patch_chunk_bytes: Conv2D input patches are made in consecutive chunks
        of at most about this many bytes.
      depthwise_chunk: examples per depthwise-conv backprop call.
      vectorize_recurrent: for the recurrent layers that take a per-example VJP of their
        whole call (layer_grads/rnn.py: RNN(cell), what rnn_rows.py and conv_lstm.py
        decline; SimpleRNN/LSTM/GRU and ConvLSTM* have handlers of their own), TF's
        vectorized_map (Keras 3; tf-keras' RNNs always take a tf.map_fn), or, False, a
        tf.map_fn over the examples: less memory, more time.
      clipped_sum: "bookkeeping" (default): each layer's clipped sum from what its norm
        used (its input and output gradient, or its per-microbatch gradients), so all
        layers keep those until every norm is known: one backward pass, more memory.
        "second_pass": ghost clipping in two passes (Li et al. 2021): the first backward
        pass only computes norms, each layer's tensors are freed after its norm, then the
        gradient of Σ_m c_m · loss_m (clip factors c_m held constant) is the clipped sum:
        the first pass's activations are kept for the second (less peak memory than
        "bookkeeping", more than "recompute"), for one more backward pass.
        "recompute": as "second_pass", but the first pass keeps nothing for the second
        one, which runs the forward pass again once the clip factors are known: about
        the non-private step's memory, for one more forward and backward pass. Refused
        for models that draw random numbers in their forward pass (Dropout, ...).
      norms_in_backward: with "bookkeeping", each layer's norms (and per-microbatch
        gradients) are computed inside the backward pass, as soon as its output gradient
        is known, and the gradient flows on to the layers below only once they are done,
        except for recurrent layers that run their own time loop (LSTM, GRU, SimpleRNN,
        ConvLSTM), whose norms come after it; "second_pass" and "recompute" always compute
        every layer's inside. TensorFlow's executor then cannot run the cheap
        input-gradient chain ahead and hold every layer's output gradient and activation
        at once. Less peak memory (CIFAR-10 CNN 1.69–1.75× → 1.36–1.55× non-private), the
        same time within noise (docs/benchmarks.md); False computes them after it.
      fused_clipped_sum: with "bookkeeping" and the native op, the Conv2D whose clipped sum
        costs most (one whose per-microbatch gradients are not kept) computes its norms
        and its clipped sum in one native op, after every other layer's norms: its
        per-microbatch gradients are summed with their clip factors as they are formed,
        instead of TF's backprop-filter op over c·g afterwards. The same clip factors,
        for every layer, and the same sum to float rounding.
      physical_batch_size: how many examples go through the forward and backward passes
        at once. The chunks run one after the other and their clipped sums add up (each
        example's clip factor is its own); the noise is drawn once: the same update (to
        float rounding), sensitivity and ε as the whole batch, at about a chunk's peak
        memory. "auto" (default): chunks only for a batch whose kept tensors (each
        trainable layer's input and output gradient, an RNN's time-step rows, from the
        model's static shapes) exceed 64 MiB, or whose LSTM/GRU time-step rows exceed
        8 MiB where their time loop is the native op, in equal chunks of at least 64
        examples that fit (CIFAR-10 CNN at batch 256: 4 chunks, peak 0.5x non-private
        instead of 1.4x, at the same time; a GRU text classifier 0.8x instead of 1.9x,
        no slower); a batch of unknown size in chunks sized in the step, if any batch
        of 128 examples or more would be over budget; never under XLA (its CPU backend
        ran the CIFAR-10 CNN's step 20x slower in chunks); None: always the whole batch; an
        int P: chunks of at most P examples (for logical batches larger than memory allows;
        small chunks cost time: docs/engine.md, "Less memory at the same speed"). Chunks
        need one example per microbatch (num_microbatches=None); under XLA, equal chunks.
      noise: how the N(0, σ²C²) noise is drawn, from the model's secret Philox key either
        way. "gaussian" (default): Box–Muller, one sample per coordinate.
        "sum_of_gaussians": each coordinate the sum of 4 samples of std σC/2 (Holohan &
        Braghin 2021, as Opacus' secure_mode): the same distribution and ε, the
        floating-point traces of one Box–Muller sample hidden in the sum, tails to 17σ
        instead of 8.49σ; 4x the noise draw's time (benchmarks/results/noise_modes.md).
        What each protects against: docs/randomness.md, "Hardened noise".
    """

    native: bool = dataclasses.field(default_factory=_native_default)
    norm_path: str = "auto"
    # A Dense/Conv2D layer's per-microbatch gradients are materialized (one
    # batched matmul, then a cheap norm and a matrix-vector clipped sum that
    # needs nothing after the clip factors are known) unless they would take
    # more than this many bytes; then the ghost norm and the book-keeping sum
    # (no per-example tensor of the weights' size) keep memory at the size of
    # the activations.
    materialize_max_bytes: int = 64 * 2**20
    # Below this many (input channel, output channel) pairs a Conv2D's
    # per-example kernel gradients come from one depthwise-conv backprop (batch
    # folded into channels). With oneDNN's kernels that is several times faster
    # than image patches; with Eigen's (TF's default on CPUs without AVX-512) it
    # is several times slower (MNIST CNN conv1: docs/benchmarks.md), hence None:
    # chosen by the runtime (conv2d_depthwise_max_channel_pairs).
    depthwise_max_channel_pairs: Optional[int] = None
    # MNIST CNN's conv1 (8×8, stride 2, batch 256) from blocks: 11.0 ms against 33.5 from
    # patches where TF's kernels are Eigen's; its conv2 89.8 ms against 5.6 from patches
    # where they are oneDNN's (benchmarks/results/conv_blocks.md), hence None: chosen by
    # the runtime.
    conv_blocks: Optional[bool] = None
    # Tiny Gram matrices run far below the machine's speed, so for the choice
    # between the native op and a ghost norm a microbatch counts at least this
    # many rows (by multiply-adds alone the ghost norm would take the MNIST CNN's
    # conv2, 16 rows, where the native op is faster; measurements: docs/benchmarks.md).
    native_min_ghost_rows: int = 32
    # With the native op, a Conv2D with at least this many output rows per
    # microbatch has its per-microbatch gradients materialized (memory
    # permitting); fewer rows make the book-keeping sum cheaper (measured on
    # the MNIST CNN: docs/benchmarks.md).
    native_materialize_min_rows: int = 64
    # Larger batches of a Conv2D's input patches are made and used in
    # consecutive chunks of examples, so the patches of the whole batch (kh·kw
    # times the input) never exist at once (peak memory: docs/engine.md).
    patch_chunk_bytes: int = 32 * 2**20
    # The depthwise backprop's cost per example grows with the folded channel
    # count (docs/benchmarks.md), so the batch goes through it in chunks of this
    # many examples.
    depthwise_chunk: int = 128
    # Vectorized: much faster than tf.map_fn, for much more peak memory (measured
    # on an LSTM classifier: docs/benchmarks.md).
    vectorize_recurrent: bool = True
    # One backward pass, the fastest; the others trade time for memory (measured on
    # the CIFAR-10 CNN: docs/engine.md, "Less memory").
    clipped_sum: str = "bookkeeping"
    # On: lower peak memory at the same time (measured on eight models: docs/benchmarks.md).
    norms_in_backward: bool = True
    # On: the MNIST CNN's native step measured faster (docs/engine.md); off for A/B.
    fused_clipped_sum: bool = True
    # Opt-in: four times the noise draw (benchmarks/results/noise_modes.md); the default
    # stays the fast one.
    noise: str = "gaussian"
    # "auto": chunks where the kept tensors are large, where they cost no time
    # (measured on eight configurations: docs/engine.md, "Less memory at the same speed").
    physical_batch_size: Union[int, str, None] = "auto"

    def __post_init__(self):
        for name in ("native", "vectorize_recurrent", "norms_in_backward", "fused_clipped_sum"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineOptions.{name} must be True or False, got "
                                 f"{getattr(self, name)!r}.")
        if self.conv_blocks not in (None, True, False):
            raise ValueError(f"EngineOptions.conv_blocks must be None, True or False, got "
                             f"{self.conv_blocks!r}.")
        if self.norm_path not in NORM_PATHS:
            raise ValueError(f"EngineOptions.norm_path must be one of {', '.join(NORM_PATHS)}; "
                             f"got {self.norm_path!r}.")
        if self.clipped_sum not in CLIPPED_SUMS:
            raise ValueError(f"EngineOptions.clipped_sum must be one of "
                             f"{', '.join(CLIPPED_SUMS)}; got {self.clipped_sum!r}.")
        if self.noise not in NOISE_MODES:
            raise ValueError(f"EngineOptions.noise must be one of {', '.join(NOISE_MODES)}; "
                             f"got {self.noise!r}. Fix: noise='sum_of_gaussians' for hardened "
                             f"noise (docs/randomness.md), or leave the default 'gaussian'.")
        if self.norm_path == "native" and not self.native:
            raise ValueError("EngineOptions.norm_path='native' needs native=True; with "
                             "native=False use norm_path 'auto', 'ghost', 'materialize' or "
                             "'depthwise'.")
        for name, minimum in (("materialize_max_bytes", 0), ("depthwise_max_channel_pairs", 0),
                              ("native_min_ghost_rows", 0), ("native_materialize_min_rows", 0),
                              ("patch_chunk_bytes", 1), ("depthwise_chunk", 1),
                              ("physical_batch_size", 1)):
            value = getattr(self, name)
            if value is None and name in ("depthwise_max_channel_pairs", "physical_batch_size") \
                    or name == "physical_batch_size" and value == "auto":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                auto = ', "auto" or None' if name == "physical_batch_size" else ""
                raise ValueError(f"EngineOptions.{name} must be an integer >= {minimum}{auto}, "
                                 f"got {value!r}.")

    @classmethod
    def low_memory(cls, **changes):
        """Norms in a first forward/backward pass, the clipped sum from a second one.

        ``clipped_sum="recompute"``, per-microbatch gradients materialized only up to
        8 MiB per layer, patches in 4 MiB chunks: peak memory near the non-private
        step's, for one more forward and backward pass (measured on the CIFAR-10 CNN:
        docs/engine.md, "Less memory: EngineOptions.low_memory()").
        Models that draw random numbers in their forward pass (Dropout...) are refused:
        ``low_memory(clipped_sum="second_pass")`` keeps one forward pass and the
        activations (more memory than "recompute", less than the default).

        >>> EngineOptions.low_memory().clipped_sum
        'recompute'
        """
        values = {"clipped_sum": "recompute", "materialize_max_bytes": 8 * 2**20,
                  "patch_chunk_bytes": 4 * 2**20}
        values.update(changes)
        return cls(**values)

    def conv2d_depthwise_max_channel_pairs(self, onednn):
        """The Conv2D threshold in effect: the option, or by default 64 with oneDNN, else 0.

        >>> EngineOptions().conv2d_depthwise_max_channel_pairs(onednn=False)
        0
        >>> EngineOptions(depthwise_max_channel_pairs=16).conv2d_depthwise_max_channel_pairs(False)
        16
        """
        if self.depthwise_max_channel_pairs is not None:
            return self.depthwise_max_channel_pairs
        return ONEDNN_DEPTHWISE_MAX_CHANNEL_PAIRS if onednn else 0

    @property
    def forced(self):
        """The forced path, or None for "auto"."""
        return None if self.norm_path == "auto" else self.norm_path
