"""In-process A/B of MNIST DP step variants (tf.function(train_step), interleaved rounds).

    TF_TEMPERED_ROOT=<checkout> python ab_inproc2.py ROUNDS nonprivate,biasonly,matconv2,old

biasonly: the default step; matconv2: conv2's per-example gradients kept
(native_materialize_min_rows=16); old: the per-example bias gradients of the native
Conv2D path by a reduce_sum over g (the handler's code before the bias sums joined the
native op), patched in while its step is traced. The "new" variant of the results file
(per-example weights inside the native op) was measured on code since removed.
"""
import dataclasses
import os
import sys


ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
import interleaved  # noqa: E402
from tf_tempered._compat import tf  # noqa: E402
from tf_tempered.privacy import EngineOptions  # noqa: E402
from tf_tempered.privacy.layer_grads import conv  # noqa: E402

data = next(iter(dp_step._dataset("mnist", 256)))
native_kernel = conv._native_kernel


def old_native_kernel(src, hparams, path, m):  # no bias sums: linear_norms' reduce_sum
    return native_kernel(src, dataclasses.replace(hparams, use_bias=False), path, m)[0], None


variants = sys.argv[2].split(",")
steps = {}
for name in variants:
    if name == "nonprivate":
        model = dp_step._compiled("nonprivate", "mnist", 256)
    elif name.startswith("matconv2"):
        model = interleaved.mnist_dp_model(EngineOptions(native_materialize_min_rows=16))
    else:
        model = interleaved.mnist_dp_model()
    if name.startswith("old"):
        conv._native_kernel = old_native_kernel
    steps[name] = tf.function(model.train_step)
    for _ in range(5):
        steps[name](data)
    conv._native_kernel = native_kernel
interleaved.report(interleaved.time_rounds(steps, data, int(sys.argv[1])))
