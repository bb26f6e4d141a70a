"""In-process A/B of the MNIST DP step with and without the fused Conv2D clipped sum
(tf.function(train_step), interleaved rounds).

    TF_TEMPERED_ROOT=<checkout> python ab_fused.py ROUNDS nonprivate,fused,separate[,tfops]

fused: the default options (EngineOptions.fused_clipped_sum=True: conv2's norms, the clip
factors and its clipped sum in one native op); separate: fused_clipped_sum=False (conv2's
norms op, then TF's backprop-filter over c·g); tfops: native=False, for reference.
"""
import os
import sys

ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
import interleaved  # noqa: E402
from tf_tempered._compat import tf  # noqa: E402
from tf_tempered.privacy import EngineOptions  # noqa: E402

OPTIONS = {"fused": EngineOptions(), "separate": EngineOptions(fused_clipped_sum=False),
           "tfops": EngineOptions(native=False)}

data = next(iter(dp_step._dataset("mnist", 256)))
steps = {}
for name in sys.argv[2].split(","):
    if name == "nonprivate":
        model = dp_step._compiled("nonprivate", "mnist", 256)
    else:
        model = interleaved.mnist_dp_model(OPTIONS[name.rstrip("0123456789")])
    steps[name] = tf.function(model.train_step)
    for _ in range(5):
        steps[name](data)
interleaved.report(interleaved.time_rounds(steps, data, int(sys.argv[1])))
