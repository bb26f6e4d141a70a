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
"""DP-SGD in your own training loop: tf_tempered.privacy.DPGradients on Poisson batches.

The same engine as a private model's fit (per-example clipping in one backward pass,
noise from a secret key), with your own loop: DPGradients returns the noised mean of the
clipped per-example gradients, you apply it. Trains a small tanh CNN on scikit-learn's
digits (offline), prints test accuracy and ε. The batches come from poisson_batches, so the
ε they earn is the amplified Poisson one, computed for them with compute_epsilon (the
model's own ledger counts custom-loop steps without amplification, a valid but larger bound).

    python examples/custom_loop_dp.py [--epochs 20]
"""

import argparse

import tf_tempered  # the Keras TensorFlow binds: Keras 3, or Keras 2 with TF_USE_LEGACY_KERAS=1
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPGradients, compute_epsilon, poisson_batches


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--l2_norm_clip", type=float, default=1.0)
    parser.add_argument("--noise_multiplier", type=float, default=1.1)
    args = parser.parse_args(argv)

    data = tf_tempered.data.load("digits")
    model = keras.Sequential([
        keras.Input(data.input_shape),
        keras.layers.Conv2D(16, 3, activation="tanh"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    dp = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     l2_norm_clip=args.l2_norm_clip, noise_multiplier=args.noise_multiplier)
    optimizer = keras.optimizers.SGD(args.learning_rate)

    @tf.function
    def train_step(x, y, info):  # info: the Poisson batch's mask and expected size
        grads, logs = dp(x, y, sample_weight=info)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return logs

    batches = poisson_batches(data.x_train, data.y_train, expected_batch_size=args.batch_size,
                              epochs=1)  # one epoch of steps; each pass draws new batches
    steps = 0
    for epoch in range(args.epochs):
        dp.reset_metrics()
        for x, y, info in batches:
            logs = train_step(x, y, info)
            steps += 1
        print(f"epoch {epoch + 1}: loss {float(logs['loss']):.4f}, clipped fraction "
              f"{float(logs['dp_clipped_fraction']):.2f}", flush=True)
    predictions = tf.argmax(model(data.x_test), axis=1).numpy()
    accuracy = float((predictions == data.y_test).mean())
    epsilon = compute_epsilon(num_examples=len(data.y_train), batch_size=args.batch_size,
                              noise_multiplier=args.noise_multiplier, steps=steps, delta=1e-5)
    print(f"test accuracy: {accuracy:.4f}")
    print(f"epsilon: {epsilon:.2f} at delta=1e-05 (Poisson sampling, {steps} steps)")
    return accuracy, epsilon


if __name__ == "__main__":
    main()
