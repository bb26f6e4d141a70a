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
"""A small text classifier (Embedding + a Transformer encoder block) trained with DP-SGD, offline.

The data are generated, so nothing is downloaded: "reviews" of `--seq_len` tokens from a
`--vocab_size` vocabulary in which a few hundred tokens carry sentiment; the label says
whether positive or negative tokens dominate (ties are rare and resolved by a coin). The
model is what people fine-tune with DP today, in miniature: Embedding → MultiHeadAttention
(+ residual, LayerNormalization) → Dense feed-forward (+ residual, LayerNormalization) →
average pooling → Dense. Every trainable layer goes through the DP engine's handlers:
Embedding (ghost norms from the token ids, a sparse clipped sum), the attention projections
(EinsumDense), Dense, and LayerNormalization (closed-form per-example γ and β gradients).

Poisson-sampled batches (secret membership) and secret noise; ε by the RDP accountant at
δ = 1e-5 for the steps taken.

    python examples/text_classifier_dp.py [--architecture transformer|bilstm] [--epochs 5]

Measured here (defaults, Keras 3, Python 3.11, CPU): test accuracy 0.84 at ε = 3.13 (δ = 1e-5,
155 steps), about 30 s of training; the majority class is 58.5% of the test set. With
`--architecture=bilstm` (Embedding + Bidirectional(LSTM) + Dense, session 23, 2 cores with
oneDNN): 0.808 at the same ε, 12 s for the whole command.
"""

import argparse

import numpy as np

import tf_tempered  # the Keras TensorFlow binds: Keras 3, or Keras 2 with TF_USE_LEGACY_KERAS=1
from tf_tempered._compat import keras
from tf_tempered.privacy import poisson_batches
from tf_tempered.privacy.accounting import DEFAULT_DELTA, compute_epsilon


def make_reviews(num, *, vocab_size, seq_len, num_sentiment_tokens=20, seed=0):
    """(token ids [num, seq_len] int32, labels [num] in {0, 1}): which sentiment dominates."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(num_sentiment_tokens * 2, vocab_size, size=(num, seq_len))
    positive = rng.random((num, seq_len)) < 0.15
    negative = ~positive & (rng.random((num, seq_len)) < 0.15)
    ids[positive] = rng.integers(0, num_sentiment_tokens, positive.sum())
    ids[negative] = rng.integers(num_sentiment_tokens, 2 * num_sentiment_tokens, negative.sum())
    margin = positive.sum(1) - negative.sum(1)
    labels = np.where(margin == 0, rng.integers(0, 2, num), margin > 0).astype("int64")
    return ids.astype("int32"), labels


def text_classifier(*, vocab_size, seq_len, dim=32, heads=2):
    """Embedding + one Transformer encoder block + pooling + logits (a plain Keras model)."""
    tokens = keras.Input((seq_len,), dtype="int32")
    x = keras.layers.Embedding(vocab_size, dim)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(x, x)
    x = keras.layers.LayerNormalization()(keras.layers.Add()([x, attended]))
    hidden = keras.layers.Dense(2 * dim, activation=tf_tempered.TemperedSigmoid())(x)
    x = keras.layers.LayerNormalization()(
        keras.layers.Add()([x, keras.layers.Dense(dim)(hidden)]))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2)(x), name="text_classifier")


def lstm_classifier(*, vocab_size, seq_len, dim=32):
    """Embedding + a bidirectional LSTM + logits (a plain Keras model).

    Its two LSTMs take the engine's SimpleRNN/LSTM/GRU handler (rows over time steps).
    """
    tokens = keras.Input((seq_len,), dtype="int32")
    x = keras.layers.Embedding(vocab_size, dim)(tokens)
    x = keras.layers.Bidirectional(keras.layers.LSTM(dim))(x)
    return keras.Model(tokens, keras.layers.Dense(2)(x), name="lstm_classifier")


ARCHITECTURES = {"transformer": text_classifier, "bilstm": lstm_classifier}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architecture", choices=sorted(ARCHITECTURES), default="transformer")
    parser.add_argument("--num_train", type=int, default=8000)
    parser.add_argument("--num_test", type=int, default=1000)
    parser.add_argument("--vocab_size", type=int, default=5000)
    parser.add_argument("--seq_len", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=256, help="expected (Poisson) batch size")
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--l2_norm_clip", type=float, default=1.0)
    parser.add_argument("--noise_multiplier", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=DEFAULT_DELTA)
    parser.add_argument("--seed", type=int, default=0,
                        help="data and weight initialisation only; DP noise and batches are secret")
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)

    shape = dict(vocab_size=args.vocab_size, seq_len=args.seq_len)
    x_train, y_train = make_reviews(args.num_train, seed=args.seed, **shape)
    x_test, y_test = make_reviews(args.num_test, seed=args.seed + 1, **shape)

    model = tf_tempered.make_private(ARCHITECTURES[args.architecture](**shape),
                                     l2_norm_clip=args.l2_norm_clip,
                                     noise_multiplier=args.noise_multiplier)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    steps = args.epochs * round(args.num_train / args.batch_size)
    batches = poisson_batches(x_train, y_train, expected_batch_size=args.batch_size, steps=steps)
    history = model.fit(batches, shuffle=False, verbose=2).history
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    epsilon = compute_epsilon(num_examples=args.num_train, batch_size=args.batch_size,
                              noise_multiplier=args.noise_multiplier, steps=steps,
                              delta=args.delta)
    print(f"clipped fraction: {history['dp_clipped_fraction'][-1]:.2f}")
    print(f"test accuracy: {accuracy:.4f}")
    print(f"epsilon: {epsilon:.2f} at delta={args.delta:g} ({steps} steps, Poisson sampling, "
          "RDP accountant)")
    return accuracy, epsilon


if __name__ == "__main__":
    main()
