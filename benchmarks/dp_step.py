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
"""Side-by-side DP-SGD step time and peak memory, all paths in ONE process.

Paths (paper MNIST CNN unless noted; synthetic inputs of the real shapes):
  nonprivate      plain SGD, mean loss (the baseline of every ratio)
  tf_tempered     tf_tempered.privacy.make_private + tf_tempered.privacy.DPKerasSGDOptimizer
                  (TF Privacy's update rule and arguments; the same step with TF Privacy's
                  own DPKerasSGDOptimizer, as tests/test_optimizers.py checks)
  tf_tempered_ghost  the same with EngineOptions(norm_path="ghost"): every row layer by its ghost
                  norm (less memory than kept per-microbatch gradients, more time)
  tf_tempered_separate  the same with EngineOptions(fused_clipped_sum=False): no Conv2D's
                  clipped sum fused with its norms (the default before 2026-12-05) (on request)
  tf_tempered_norms_after  the same with EngineOptions(norms_in_backward=False): each layer's
                  norms computed after the backward pass (the default before 2026-11-27)
  tf_tempered_chunks64 / _chunks128 / _whole  the same with
                  EngineOptions(physical_batch_size=64 / 128 / None): the forward and backward
                  passes on chunks of that many examples, one after the other, noise once; or
                  the whole batch at once (the default, "auto", chunks only a batch whose kept
                  tensors exceed 64 MiB) (only when asked for in --paths)
  tf_tempered_tf_ops  the same with TF ops only (no native conv op: the fallback
                  without a C++ compiler, or with TF_TEMPERED_NATIVE=0)
  tf_tempered_tf_ops_depthwise / _patches / _blocks  the same with a Conv2D's depthwise
                  backprop forced on (up to 64 channel pairs); off, kept gradients from image
                  patches (under XLA: products per offset); off, kept gradients of strided
                  layers from products per block of offsets (depthwise_max_channel_pairs=64 /
                  0 / 0, conv_blocks unset / False / True; by default the depthwise backprop is
                  on only where TF's CPU kernels are oneDNN's, the blocks only where they are
                  not, outside XLA)
  dpsequential    TF Privacy's DPSequential (vectorized per-example grads, XLA)
  stock_optimizer TF Privacy's DPKerasSGDOptimizer alone, num_microbatches = batch
  <path>_xla      the path compiled with jit_compile=True (XLA; the engine then takes its
                  TF-ops paths, what a GPU runs): --jit_compile adds nonprivate_xla and
                  tf_tempered_xla, each _xla row's ratios taken against nonprivate_xla

The last two need TF Privacy (Python <= 3.11); where it is not installed, the default
--paths leaves them out.

Rounds interleave the paths so machine noise hits all of them alike; the table
reports the median wall-clock and CPU (all threads) ms/step per path, their ratios
to nonprivate, and the peak of TF's CPU allocator during that path's steps
(tf.config.experimental.get_memory_info).

    python benchmarks/dp_step.py                       # docs/benchmarks.md's first table
    python benchmarks/dp_step.py --model=cifar10 --paths=nonprivate,tf_tempered
    python benchmarks/dp_step.py --batch_size=4096 --paths=nonprivate,tf_tempered
    python benchmarks/dp_step.py --model=cifar10 --paths=nonprivate,tf_tempered --dynamic_batch
    python benchmarks/dp_step.py --model=text --paths=nonprivate,tf_tempered   # Embedding 50k×64 + MHA
    python benchmarks/dp_step.py --model=lstm --paths=nonprivate,tf_tempered   # Embedding 10k×64 + LSTM(64)
    python benchmarks/dp_step.py --model=gru --paths=nonprivate,tf_tempered    # the same with GRU(64)
    python benchmarks/dp_step.py --model=gru_reset_before --paths=nonprivate,tf_tempered
        # GRU(64, reset_after=False); --model=rnn_lstm_cell: RNN(LSTMCell(64))
    python benchmarks/dp_step.py --model=conv1d_family --paths=nonprivate,tf_tempered
        # DepthwiseConv1D, SeparableConv1D, Conv1DTranspose
    python benchmarks/dp_step.py --model=time_distributed --paths=nonprivate,tf_tempered
    python benchmarks/dp_step.py --model=conv_lstm --paths=nonprivate,tf_tempered   # batch 64:
        # ConvLSTM2D(8, 3) on [B, 4, 16, 16, 3] + Dense
    python benchmarks/dp_step.py --keras=2 --model=locally_connected --paths=nonprivate,tf_tempered
        # tf-keras' LocallyConnected2D/1D (Keras 2 only); _masked, _sparse: implementation=2, 3
    python benchmarks/dp_step.py --model=lora --paths=nonprivate,tf_tempered   # batch 64:
        # a 2-block transformer, rank-4 LoRA on its Dense/EinsumDense (Keras 3)
    python benchmarks/dp_step.py --keras=2             # Keras 2 (tf-keras) + TF Privacy's paths
    python benchmarks/dp_step.py --jit_compile         # + the XLA-compiled steps (the GPU path)

--keras=2|3 selects the Keras before TensorFlow is imported (it sets or unsets
TF_USE_LEGACY_KERAS, TensorFlow's own switch); without it, the environment decides
(Keras 3 unless TF_USE_LEGACY_KERAS=1). One process runs one Keras: to compare Keras 3
with Keras 2, see benchmarks/keras_versions.py (alternating fresh processes).
"""

import os
import sys


def select_keras(argv, environ):
    """Applies --keras=2|3 from argv to environ (TF_USE_LEGACY_KERAS); returns 2, 3 or None.

    Must run before TensorFlow is imported: TensorFlow reads the variable once, when
    `tf.keras` is first touched.
    """
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith("--keras="):
            value = arg.split("=", 1)[1]
        elif arg == "--keras" and i + 1 < len(argv):
            value = argv[i + 1]
    if value is None:
        return None
    if value not in ("2", "3"):
        raise SystemExit(f"--keras must be 2 or 3, got {value!r}")
    if value == "2":
        environ["TF_USE_LEGACY_KERAS"] = "1"
    else:
        environ.pop("TF_USE_LEGACY_KERAS", None)
    return int(value)


if __name__ == "__main__":  # before TensorFlow is imported (below)
    select_keras(sys.argv[1:], os.environ)
    # TF keeps CPU allocator statistics (the peak memory column) only with the BFC
    # allocator on CPU; it must be chosen before TensorFlow is imported.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# pylint: disable=wrong-import-position
import argparse
import importlib.metadata
import json
import platform
import statistics
import time

import numpy as np

import tf_tempered
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered import models
from tf_tempered._compat import require_tensorflow_privacy, tensorflow_privacy
from tf_tempered import keras_bridge
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, is_private, layer_paths, make_private

PATHS = ("nonprivate", "tf_tempered", "tf_tempered_ghost", "tf_tempered_norms_after",
         "tf_tempered_separate", "tf_tempered_tf_ops",
         "tf_tempered_tf_ops_depthwise", "tf_tempered_tf_ops_patches",
         "tf_tempered_tf_ops_blocks", "tf_tempered_second_pass", "tf_tempered_low_memory",
         "tf_tempered_chunks64", "tf_tempered_chunks128", "tf_tempered_whole",
         "dpsequential", "stock_optimizer")
TF_PRIVACY_PATHS = ("dpsequential", "stock_optimizer")
LOW_MEMORY_PATHS = ("tf_tempered_second_pass", "tf_tempered_low_memory",
                    "tf_tempered_chunks64", "tf_tempered_chunks128", "tf_tempered_whole")
# tf_tempered_second_pass (the clipped sum by a second backward pass) and
# tf_tempered_low_memory (EngineOptions.low_memory(): the same with a second forward
# pass), tf_tempered_chunks64/128/_whole (EngineOptions.physical_batch_size) only when
# asked for in --paths.
XLA_SUFFIX = "_xla"
XLA_PATHS = ("nonprivate_xla", "tf_tempered_xla")  # what --jit_compile adds
# The TF-ops path with the Conv2D depthwise backprop on (64 channel pairs) or off, and kept
# gradients from patches or blocks, whatever kernels TF runs
# (EngineOptions.depthwise_max_channel_pairs, conv_blocks): only when asked for.
TF_OPS_CONV_PATHS = ("tf_tempered_tf_ops_depthwise", "tf_tempered_tf_ops_patches",
                     "tf_tempered_tf_ops_blocks")
DEFAULT_PATHS = tuple(p for p in PATHS if p not in (
    LOW_MEMORY_PATHS + TF_OPS_CONV_PATHS
    + ("tf_tempered_ghost", "tf_tempered_norms_after", "tf_tempered_separate")) and (
    tensorflow_privacy is not None or p not in TF_PRIVACY_PATHS))


def environment():
    """Which Keras (and versions) this process runs: recorded with every result."""
    return {"keras_major": KERAS_MAJOR, "keras_version": keras.__version__,
            "keras_module": keras.__name__, "tensorflow": tf.__version__,
            "tf_tempered": tf_tempered.__version__,
            "tensorflow_privacy": (importlib.metadata.version("tensorflow-privacy")
                                   if tensorflow_privacy is not None else None),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _loads(values):
    return "/".join(f"{v:.2f}" for v in values) if values else "n/a"


TEXT_VOCAB, TEXT_LENGTH, TEXT_DIM = 50_000, 64, 64


def _encoder_block(x):
    """A Transformer encoder block: MultiHeadAttention (4 heads) and a tanh MLP, post-norm."""
    attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=TEXT_DIM // 4)(x, x)
    x = keras.layers.LayerNormalization()(keras.layers.Add()([x, attended]))
    hidden = keras.layers.Dense(2 * TEXT_DIM, activation="tanh")(x)
    return keras.layers.LayerNormalization()(
        keras.layers.Add()([x, keras.layers.Dense(TEXT_DIM)(hidden)]))


def _text_model(blocks=1):
    """A text classifier: Embedding 50 000 × 64 + Transformer encoder blocks (issue 14's row:
    one block)."""
    tokens = keras.Input((TEXT_LENGTH,), dtype="int32")
    x = keras.layers.Embedding(TEXT_VOCAB, TEXT_DIM)(tokens)
    for _ in range(blocks):
        x = _encoder_block(x)
    return keras.Model(tokens, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x)))


LORA_RANK = 4


def _lora_model():
    """LoRA fine-tuning (Keras 3): the text classifier with two encoder blocks, rank-4 LoRA on
    every Dense/EinsumDense of the blocks (attention projections and MLPs, base kernels
    frozen), Embedding and LayerNormalization frozen, the classifier head trained in full."""
    if KERAS_MAJOR != 3:
        raise SystemExit("--model=lora needs Keras 3 (tf-keras has no enable_lora).")
    model = _text_model(blocks=2)
    head = model.layers[-1]
    for layer in keras_bridge.flatten_layers(model):
        if isinstance(layer, (keras.layers.Embedding, keras.layers.LayerNormalization)):
            layer.trainable = False
        elif (isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
              and layer is not head):
            layer.enable_lora(LORA_RANK)
    return model


LSTM_VOCAB = 10_000


RECURRENT_MODELS = ("lstm", "gru", "gru_reset_before", "rnn_lstm_cell")
# tf-keras' LocallyConnected layers, by their `implementation` (Keras 2 only).
LOCALLY_CONNECTED_MODELS = {"locally_connected": 1, "locally_connected_masked": 2,
                            "locally_connected_sparse": 3}


def _recurrent_model(unit="lstm"):
    """A recurrent text classifier: Embedding 10 000 × 64 + LSTM(64) or GRU(64) + Dense
    (issue 14's and 30's rows)."""
    return keras.Sequential([
        keras.Input((TEXT_LENGTH,), dtype="int32"),
        keras.layers.Embedding(LSTM_VOCAB, TEXT_DIM),
        {"lstm": lambda: keras.layers.LSTM(64), "gru": lambda: keras.layers.GRU(64),
         "gru_reset_before": lambda: keras.layers.GRU(64, reset_after=False),
         "rnn_lstm_cell": lambda: keras.layers.RNN(keras.layers.LSTMCell(64))}[unit](),
        keras.layers.Dense(10),
    ])


def _conv1d_model():
    """An audio/text-style Conv1D stack (dilated, strided) on [B, 128, 16] (issue 14's row)."""
    return keras.Sequential([
        keras.Input((128, 16)),
        keras.layers.Conv1D(32, 5, padding="same", activation="tanh"),
        keras.layers.Conv1D(32, 3, dilation_rate=2, padding="causal", activation="tanh"),
        keras.layers.Conv1D(64, 3, strides=2, activation="tanh"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(10),
    ])


def _conv1d_family_model():
    """DepthwiseConv1D, SeparableConv1D and Conv1DTranspose on [B, 128, 16] (issue 30's
    slow families, each through its 2-D handler since they have one)."""
    return keras.Sequential([
        keras.Input((128, 16)),
        keras.layers.Conv1D(32, 5, padding="same", activation="tanh"),
        keras.layers.DepthwiseConv1D(5, padding="same", activation="tanh"),
        keras.layers.SeparableConv1D(64, 3, strides=2, padding="same", activation="tanh"),
        keras.layers.Conv1DTranspose(32, 3, strides=2, padding="same", activation="tanh"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(10),
    ])


def _time_distributed_model():
    """A clip classifier: TimeDistributed Conv2D layers on [B, 4, 16, 16, 3] (Keras 3 calls
    each once per frame), then Dense (issue 30's TimeDistributed(Conv2D) row)."""
    spread = keras.layers.TimeDistributed
    return keras.Sequential([
        keras.Input((4, 16, 16, 3)),
        spread(keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="tanh")),
        spread(keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="tanh")),
        spread(keras.layers.GlobalAveragePooling2D()),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])


def _conv_lstm_model():
    """A video-frame ConvLSTM: ConvLSTM2D(8, 3) over [B, 4, 16, 16, 3], then Flatten + Dense."""
    return keras.Sequential([
        keras.Input((4, 16, 16, 3)),
        keras.layers.ConvLSTM2D(8, 3),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])


def _mobilenet_model():
    """A MobileNet-style block: DepthwiseConv2D + pointwise Conv2D, SeparableConv2D (32×32×3)."""
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="tanh"),
        keras.layers.DepthwiseConv2D(3, padding="same", activation="tanh"),
        keras.layers.Conv2D(32, 1, activation="tanh"),
        keras.layers.SeparableConv2D(64, 3, strides=2, padding="same", activation="tanh"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def _locally_connected_model(implementation=1):
    """tf-keras' LocallyConnected layers (Keras 3 has none) after a Conv2D on 32×32×3.

    implementation=1 (--model=locally_connected): LocallyConnected2D(16, 3) on 16×16×16 (196
    positions, a 144×16 kernel each), then LocallyConnected1D(8, 4, strides=4) on its 196
    pixels as a sequence. implementation=2 (_masked) and 3 (_sparse), whose kernels are a
    masked dense [I, O] and its nonzero entries: LocallyConnected2D(8, 3, strides=2) on 16×16×8
    (I = 2048, O = 392).
    """
    if KERAS_MAJOR == 3:
        raise SystemExit("--model=locally_connected* needs Keras 2 (--keras=2): "
                         "Keras 3 has no LocallyConnected layers.")
    layers = [keras.Input((32, 32, 3))]
    if implementation == 1:
        layers += [
            keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="tanh"),
            keras.layers.LocallyConnected2D(16, 3, activation="tanh"),
            keras.layers.Reshape((196, 16)),
            keras.layers.LocallyConnected1D(8, 4, strides=4, activation="tanh")]
    else:
        layers += [
            keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="tanh"),
            keras.layers.LocallyConnected2D(8, 3, strides=2, activation="tanh",
                                            implementation=implementation)]
    return keras.Sequential(layers + [keras.layers.Flatten(), keras.layers.Dense(10)])


def _model(kind, activation="tanh"):
    if kind == "text":
        return _text_model()
    if kind == "lora":
        return _lora_model()
    if kind == "conv1d":
        return _conv1d_model()
    if kind == "conv1d_family":
        return _conv1d_family_model()
    if kind == "time_distributed":
        return _time_distributed_model()
    if kind == "conv_lstm":
        return _conv_lstm_model()
    if kind in RECURRENT_MODELS:
        return _recurrent_model(kind)
    if kind == "mobilenet":
        return _mobilenet_model()
    if kind in LOCALLY_CONNECTED_MODELS:
        return _locally_connected_model(LOCALLY_CONNECTED_MODELS[kind])
    return models.mnist_cnn(activation) if kind == "mnist" else models.cifar10_cnn(activation)


def _compiled(path, kind, batch_size):
    """The compiled model of ``path``; ``<path>_xla``: the same, compiled with XLA."""
    if path.endswith(XLA_SUFFIX):
        model = _compiled(path[:-len(XLA_SUFFIX)], kind, batch_size)
        model.compile(model.optimizer, loss=model.loss, jit_compile=True)
        return model
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    dp = dict(l2_norm_clip=1.0, noise_multiplier=1.1)
    # Keras 2: the legacy SGD (TF Privacy's optimizers subclass it); Keras 3 has no legacy ones.
    sgd = keras.optimizers.legacy.SGD if KERAS_MAJOR == 2 else keras.optimizers.SGD
    if path == "nonprivate":
        model = _model(kind)
        model.compile(sgd(0.15),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elif path in ("tf_tempered", "tf_tempered_tf_ops", "tf_tempered_ghost",
                  "tf_tempered_norms_after", "tf_tempered_separate") + LOW_MEMORY_PATHS \
            + TF_OPS_CONV_PATHS:
        model = _model(kind)
        # tf_tempered_tf_ops: the engine without the native conv op; _ghost: ghost norms
        # wherever a layer has them; _second_pass: the clipped sum by a second backward
        # pass, small workspaces; _low_memory: the same with a second forward pass too.
        options = {"tf_tempered": None, "tf_tempered_tf_ops": EngineOptions(native=False),
                   "tf_tempered_second_pass": EngineOptions.low_memory(clipped_sum="second_pass"),
                   "tf_tempered_low_memory": EngineOptions.low_memory(),
                   "tf_tempered_chunks64": EngineOptions(physical_batch_size=64),
                   "tf_tempered_chunks128": EngineOptions(physical_batch_size=128),
                   "tf_tempered_whole": EngineOptions(physical_batch_size=None),
                   "tf_tempered_ghost": EngineOptions(norm_path="ghost"),
                   "tf_tempered_norms_after": EngineOptions(norms_in_backward=False),
                   "tf_tempered_separate": EngineOptions(fused_clipped_sum=False),
                   "tf_tempered_tf_ops_depthwise": EngineOptions(
                       native=False, depthwise_max_channel_pairs=64),
                   "tf_tempered_tf_ops_patches": EngineOptions(
                       native=False, depthwise_max_channel_pairs=0, conv_blocks=False),
                   "tf_tempered_tf_ops_blocks": EngineOptions(
                       native=False, depthwise_max_channel_pairs=0, conv_blocks=True)}[path]
        make_private(model, options=options)
        model.compile(DPKerasSGDOptimizer(**dp, learning_rate=0.15), loss=per_example)
    elif path == "dpsequential":
        tensorflow_privacy_ = require_tensorflow_privacy(f"The benchmark path {path!r}")
        layers = [layer for layer in _model(kind).layers
                  if not isinstance(layer, keras.layers.InputLayer)]
        model = tensorflow_privacy_.DPSequential(**dp, layers=layers, use_xla=True)
        model.build((None,) + _input_shape(kind))
        model.compile(sgd(0.15),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elif path == "stock_optimizer":
        tensorflow_privacy_ = require_tensorflow_privacy(f"The benchmark path {path!r}")
        model = _model(kind)
        model.train_step = type(model).train_step.__get__(model)
        model.compile(tensorflow_privacy_.DPKerasSGDOptimizer(
            **dp, num_microbatches=batch_size, learning_rate=0.15), loss=per_example)
    else:
        raise ValueError(f"unknown path {path!r}; choose from {PATHS}")
    return model


def _input_shape(kind):
    return {"mnist": (28, 28, 1), "cifar10": (32, 32, 3), "text": (TEXT_LENGTH,),
            **{kind: (TEXT_LENGTH,) for kind in RECURRENT_MODELS}, "lora": (TEXT_LENGTH,),
            "conv1d": (128, 16), "conv1d_family": (128, 16), "time_distributed": (4, 16, 16, 3),
            "conv_lstm": (4, 16, 16, 3), "mobilenet": (32, 32, 3),
            **{kind: (32, 32, 3) for kind in LOCALLY_CONNECTED_MODELS}}[kind]


def _dataset(kind, batch_size, dynamic_batch=False):
    rng = np.random.default_rng(0)
    if kind in ("text", "lora") + RECURRENT_MODELS:
        vocab = LSTM_VOCAB if kind in RECURRENT_MODELS else TEXT_VOCAB
        x = rng.integers(0, vocab, (batch_size,) + _input_shape(kind)).astype(np.int32)
    else:
        x = rng.random((batch_size,) + _input_shape(kind), dtype=np.float32)
    y = rng.integers(0, 10, batch_size)
    # tf.data's autotuner paces some fit() calls at ~15 ms/step on a 2-core
    # machine whatever the model costs (measured: 7.5 or 15.3 ms per step of the
    # same non-private model, one or the other per call), which would hide the
    # differences measured here. The data is one in-memory batch: nothing to tune.
    options = tf.data.Options()
    options.autotune.enabled = False
    data = tf.data.Dataset.from_tensors((x, y))
    if dynamic_batch:  # batch size unknown while tracing, as in model.fit(x, y, batch_size=...)
        # Batched before the repeat: fit refuses a pipeline that repeats before an unbatch
        # (an example's share of a batch could not be bounded; fit_data.py).
        data = data.unbatch().batch(batch_size)
    return data.repeat().with_options(options)


def baselines(paths, timed):
    """{path: the path its ratios are taken against}: the non-private step compiled the same
    way (with or without XLA), None where that step was not timed.

    >>> baselines(["nonprivate_xla", "tf_tempered_xla", "tf_tempered"],
    ...           ["nonprivate_xla", "tf_tempered_xla", "tf_tempered"])
    {'nonprivate_xla': 'nonprivate_xla', 'tf_tempered_xla': 'nonprivate_xla', 'tf_tempered': None}
    """
    same_way = {p: "nonprivate_xla" if p.endswith(XLA_SUFFIX) else "nonprivate" for p in paths}
    return {p: ref if ref in timed else None for p, ref in same_way.items()}


def main():
    global TEXT_LENGTH  # pylint: disable=global-statement  (--sequence_length)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mnist", "cifar10", "text", "conv1d", "conv1d_family",
                                            "time_distributed", "conv_lstm", "mobilenet", "lora")
                        + tuple(LOCALLY_CONNECTED_MODELS)
                        + RECURRENT_MODELS,
                        default="mnist")
    parser.add_argument("--sequence_length", type=int, default=TEXT_LENGTH,
                        help="tokens per example of the text, LoRA and recurrent models")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="default 256 (64 for --model=lora and conv_lstm)")
    parser.add_argument("--paths", default=",".join(DEFAULT_PATHS))
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--stock_steps", type=int, default=1,
                        help="timed steps per round for the (very slow) stock optimizer")
    parser.add_argument("--dynamic_batch", action="store_true",
                        help="hide the batch size from tracing (the path of model.fit on arrays)")
    parser.add_argument("--keras", choices=("2", "3"),
                        help="Keras 2 (tf-keras) or 3; default: the environment's "
                             "(3 unless TF_USE_LEGACY_KERAS=1). Applied before TF is imported.")
    parser.add_argument("--jit_compile", action="store_true",
                        help="also time nonprivate_xla and tf_tempered_xla (jit_compile=True)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    TEXT_LENGTH = args.sequence_length
    if args.keras is not None and int(args.keras) != KERAS_MAJOR:
        raise SystemExit(f"--keras={args.keras} asked, but this process runs Keras {KERAS_MAJOR}: "
                         "run dp_step.py as a program so the flag applies before TF is imported.")
    if args.batch_size is None:
        args.batch_size = 64 if args.model in ("lora", "conv_lstm") else 256
    paths = args.paths.split(",")
    if args.jit_compile:
        paths += [p for p in XLA_PATHS if p not in paths]
    unknown = [p for p in paths if p.removesuffix(XLA_SUFFIX) not in PATHS]
    if unknown:
        raise SystemExit(f"unknown path(s) {', '.join(unknown)}: choose from {', '.join(PATHS)}, "
                         f"each optionally with the suffix {XLA_SUFFIX}.")
    if KERAS_MAJOR == 3 and any(p in TF_PRIVACY_PATHS for p in paths):
        raise SystemExit(f"The paths {', '.join(TF_PRIVACY_PATHS)} need TF Privacy, which works "
                         "with Keras 2 only: run with --keras=2, or leave them out of --paths.")
    env_before = environment()
    data = _dataset(args.model, args.batch_size, args.dynamic_batch)
    compiled = {p: _compiled(p, args.model, args.batch_size) for p in paths}
    times = {p: [] for p in paths}
    cpu_times = {p: [] for p in paths}  # all threads: less sensitive to scheduling noise
    peaks = {p: 0 for p in paths}
    for p, model in compiled.items():  # trace and warm up outside the timed rounds
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)
    for _ in range(args.rounds):
        for p, model in compiled.items():
            steps = args.stock_steps if p == "stock_optimizer" else args.steps
            tf.config.experimental.reset_memory_stats("CPU:0")
            start, cpu_start = time.perf_counter(), time.process_time()
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
            times[p].append((time.perf_counter() - start) / steps * 1000)
            cpu_times[p].append((time.process_time() - cpu_start) / steps * 1000)
            peaks[p] = max(peaks[p], tf.config.experimental.get_memory_info("CPU:0")["peak"])
    baseline = baselines(paths, times)
    rows = []
    env = dict(env_before, load_average_before=env_before["load_average"],
               load_average_after=environment()["load_average"])
    del env["load_average"]
    print(f"\n{args.model} {'classifier' if args.model in ('text', 'lora') else 'model'}, batch {args.batch_size}{' (dynamic)' if args.dynamic_batch else ''}, "
          f"Keras {env['keras_version']} ({env['keras_module']}), "
          f"{env['processor']}, TF {tf.__version__}, tf_tempered {tf_tempered.__version__}, "
          f"Python {env['python']}; load average (1/5/15 min) before "
          f"{_loads(env['load_average_before'])}, after {_loads(env['load_average_after'])}")
    print("| path | jit_compile | ms/step | × non-private | CPU ms/step | × non-private | peak MiB "
          "| × non-private |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for p in paths:
        ms, cpu_ms = statistics.median(times[p]), statistics.median(cpu_times[p])
        ref = baseline[p]
        row = {"path": p, "ms_per_step": ms, "cpu_ms_per_step": cpu_ms, "peak_bytes": peaks[p],
               "baseline": ref,
               "time_ratio": ms / statistics.median(times[ref]) if ref else None,
               "cpu_ratio": cpu_ms / statistics.median(cpu_times[ref]) if ref else None,
               "memory_ratio": peaks[p] / peaks[ref] if ref else None,
               # Keras 3's compile(jit_compile="auto") is False on a CPU-only machine.
               "jit_compile": bool(getattr(compiled[p], "jit_compile", False))}
        rows.append(row)
        print(f"| {p} | {'yes' if row['jit_compile'] else 'no'} | {ms:.1f} | "
              f"{row['time_ratio'] or float('nan'):.2f} | {cpu_ms:.1f} | "
              f"{row['cpu_ratio'] or float('nan'):.2f} | {peaks[p] / 2**20:.0f} | "
              f"{row['memory_ratio'] or float('nan'):.2f} |")
    for row in rows:  # which handler and path each layer took (tf_tempered's paths)
        if is_private(compiled[row["path"]]):
            row["layer_paths"] = layer_paths(compiled[row["path"]])
            print(f"\nPer-layer handlers and paths of {row['path']}:\n\n"
                  "| layer | class | handler | path |\n|---|---|---|---|")
            for lp in row["layer_paths"]:
                print(f"| {lp['layer']} | {lp['class']} | {lp['handler']} | {lp['path']} |")
    if "tf_tempered" in times and "stock_optimizer" in times:
        print(f"\ntf_tempered is {statistics.median(times['stock_optimizer']) / statistics.median(times['tf_tempered']):.0f}× "
              "faster than the stock DPKerasSGDOptimizer.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "environment": env, "rows": rows, "times": times,
                       "cpu_times": cpu_times}, f, indent=1)


if __name__ == "__main__":
    main()
