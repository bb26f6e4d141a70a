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
"""Seeds of DP randomness: the OS's entropy (``secrets``), or the ``insecure_dp_seed`` opt-in.

A secret seed is ``secrets.randbits``, fresh for each consumer, never ``--seed``,
``keras.utils.set_random_seed`` or ``tf.random.set_seed``. ``insecure_dp_seed=K`` (an int)
derives it from K instead, the first 64 bits of sha256("tf_tempered/<purpose>/K"): bit-for-bit
reproducible DP runs for debugging and tests, and NOT private; the first such use in a
process warns (:class:`InsecureDPRandomnessWarning`). The Philox streams keyed by these
seeds: :mod:`tf_tempered.privacy.randomness`.

>>> seed = secret_seed()
>>> 0 <= seed < 2 ** 63, seed == secret_seed()
(True, False)
"""

import hashlib
import numbers
import secrets
import warnings

from tf_tempered.privacy.errors import InsecureDPRandomnessWarning

__all__ = ["check_insecure_dp_seed", "secret_seed", "dp_seed", "INSECURE_NOTE"]

INSECURE_NOTE = ("the ε does NOT hold: DP noise and batch membership come from "
                 "insecure_dp_seed (reproducible by anyone who knows it, not private)")
_warned = False  # the opt-in warns once per process


def check_insecure_dp_seed(value, name="insecure_dp_seed"):
    """``value`` as an int (or None); ValueError naming ``name`` for anything else.

    >>> check_insecure_dp_seed(3), check_insecure_dp_seed(None)
    (3, None)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{name} must be an integer or None, got {value!r}. Leave it None (the "
            f"default) for secret DP randomness; an integer makes the DP noise and "
            f"batches reproducible and NOT private (for debugging and tests only).")
    return int(value)


def _warn_insecure(name, seed, stacklevel):
    """Warns the first time in this process; ``stacklevel`` counts from here to the user."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"{name}={seed}: the DP noise and Poisson batch membership of this run are a "
            f"public function of the seed, so {INSECURE_NOTE}. Use it for debugging and "
            f"tests only; leave {name}=None for a private run.",
            InsecureDPRandomnessWarning, stacklevel=stacklevel)


def _derived(seed, purpose):
    digest = hashlib.sha256(f"tf_tempered/{purpose}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def secret_seed():
    """A fresh 63-bit seed from the OS's entropy (for tf.data ops that take a seed)."""
    return secrets.randbits(63)


def dp_seed(purpose, *, insecure_dp_seed=None, name="insecure_dp_seed"):
    """A 63-bit seed for a privacy-relevant tf.data op: secret, or derived from the opt-in.

    For ops that only take a Python seed (e.g. ``Dataset.shuffle`` of a DP run); the
    seed then sits in that dataset's in-memory graph. Prefer
    :class:`~tf_tempered.privacy.randomness.DPRandomness`.
    """
    seed = check_insecure_dp_seed(insecure_dp_seed, name)
    if seed is None:
        return secret_seed()
    _warn_insecure(name, seed, stacklevel=3)  # at dp_seed's caller
    return _derived(seed, purpose) >> 1
