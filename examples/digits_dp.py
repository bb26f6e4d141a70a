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
"""The main job in a minute, offline: DP-SGD training of the paper's MNIST CNN on digits.

scikit-learn's 8×8 `digits` (1 797 images, shipped with scikit-learn) are resized to 28×28
so the paper's Table 1 network applies unchanged; the model uses the tempered sigmoid
(2, 2, 1) = tanh and trains with tf_tempered's DPKerasSGDOptimizer (TF Privacy's name,
arguments and update rule; no TF Privacy needed) on tf_tempered's fast engine. ``fit`` on
the arrays draws Poisson batches (secret membership), so the ε it logs (RDP accountant,
δ = 1e-5) is the amplified one those batches earn. Prints test accuracy and ε.

    python examples/digits_dp.py [--epochs 30] [--noise_multiplier 1.1]
"""

import argparse

import tensorflow as tf

import tf_tempered  # uses the Keras TensorFlow binds: Keras 3, or Keras 2 with TF_USE_LEGACY_KERAS=1
from tf_tempered._compat import keras
from tf_tempered.privacy import DPKerasSGDOptimizer
from tf_tempered.privacy.accounting import DEFAULT_DELTA


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--l2_norm_clip", type=float, default=1.0)
    parser.add_argument("--noise_multiplier", type=float, default=1.1)
    parser.add_argument("--delta", type=float, default=DEFAULT_DELTA)
    parser.add_argument("--seed", type=int, default=0,
                        help="weight initialisation only; the DP noise and batches are secret")
    args = parser.parse_args()
    keras.utils.set_random_seed(args.seed)

    digits = tf_tempered.data.load("digits")
    resize = lambda images: tf.image.resize(images, (28, 28)).numpy()
    x_train, x_test = resize(digits.x_train), resize(digits.x_test)

    model = tf_tempered.make_private(
        tf_tempered.mnist_cnn("tempered_sigmoid", num_classes=digits.num_classes),
        delta=args.delta)
    model.compile(
        optimizer=DPKerasSGDOptimizer(l2_norm_clip=args.l2_norm_clip,
                                      noise_multiplier=args.noise_multiplier,
                                      learning_rate=args.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    # Poisson batches of expected size batch_size, drawn from a secret key (as the noise).
    history = model.fit(x_train, digits.y_train, batch_size=args.batch_size,
                        epochs=args.epochs, verbose=2)
    _, accuracy = model.evaluate(x_test, digits.y_test, verbose=0)
    print(f"clipped fraction (last epoch): {history.history['dp_clipped_fraction'][-1]:.2f}, "
          f"mean per-example gradient norm: {history.history['dp_grad_norm'][-1]:.2f}")
    print(f"test accuracy: {accuracy:.4f}")
    print(f"epsilon: {history.history['epsilon'][-1]:.2f} at "
          f"delta={history.history['delta'][-1]:g} (RDP accountant, Poisson sampling as "
          f"trained)")


if __name__ == "__main__":
    main()
