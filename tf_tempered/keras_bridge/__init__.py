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
"""The DP engine's one door into Keras and TF Privacy internals, for Keras 2 (tf-keras) and 3.

Everything the engine reads or sets on Keras objects beyond their public API goes
through this package; the Keras 2 / Keras 3 differences are branches in its modules
(chosen once by `tf_tempered._compat.KERAS_MAJOR`), so the handlers in `layer_grads/`
and the step's stages take plain tensors and numbers and serve both. This file only
re-exports:

* :mod:`.layers`: layer traversal, the weights a layer owns, activity regularizers;
* :mod:`.variables`: variables' keys, shapes and the tf.Variable a Keras 3 variable holds;
* :mod:`.recurrent`: recurrent units (RNN layers), their masks and call arguments;
* :mod:`.losses`: the compiled loss per example (the user's compile as written);
* :mod:`.training`: the optimizer a LossScaleOptimizer wraps, XLA, fit's arguments, the
  compile config saved with a model, callbacks;
* :mod:`.optimizers`: loss scaling in an optimizer's apply, the guard of every update;
* :mod:`.datasets`: tf.data pipelines read (a transformation's kind and inputs, the
  batching) and the transformations named by what they keep;
* :mod:`.tf_privacy`: the settings of TF Privacy's DP optimizers;
* :mod:`.compiled_state`: Keras 3's compiled metrics and loss, built before fit traces;
* :mod:`.graphs`: a traced graph's ops with those of the functions they run;
* :mod:`.code_origin`: whether a class or a layer's call is Keras' own code;
* :mod:`.input_axes`: the sizes of a weighted layer's input axes, as its weights fix them;
* :mod:`.runtime`: TensorFlow runtime facts (whether its CPU kernels are oneDNN's);
* :mod:`.preprocessing`: preprocessing layers whose state adapt() fit to data;
* :mod:`.saving_hooks`: a check before every model save, hooks around compiles and
  weights files.
"""

from tf_tempered.keras_bridge.layers import *  # noqa: F401,F403
from tf_tempered.keras_bridge.layers import __all__ as _layers_all
from tf_tempered.keras_bridge.variables import *  # noqa: F401,F403
from tf_tempered.keras_bridge.variables import __all__ as _variables_all
from tf_tempered.keras_bridge.recurrent import *  # noqa: F401,F403
from tf_tempered.keras_bridge.recurrent import __all__ as _recurrent_all
from tf_tempered.keras_bridge.losses import *  # noqa: F401,F403
from tf_tempered.keras_bridge.losses import __all__ as _losses_all
from tf_tempered.keras_bridge.training import *  # noqa: F401,F403
from tf_tempered.keras_bridge.training import __all__ as _training_all
from tf_tempered.keras_bridge.optimizers import *  # noqa: F401,F403
from tf_tempered.keras_bridge.optimizers import __all__ as _optimizers_all
from tf_tempered.keras_bridge.datasets import *  # noqa: F401,F403
from tf_tempered.keras_bridge.datasets import __all__ as _datasets_all
from tf_tempered.keras_bridge.tf_privacy import *  # noqa: F401,F403
from tf_tempered.keras_bridge.tf_privacy import __all__ as _tf_privacy_all
from tf_tempered.keras_bridge.compiled_state import *  # noqa: F401,F403
from tf_tempered.keras_bridge.compiled_state import __all__ as _compiled_state_all
from tf_tempered.keras_bridge.runtime import *  # noqa: F401,F403
from tf_tempered.keras_bridge.graphs import *  # noqa: F401,F403
from tf_tempered.keras_bridge.graphs import __all__ as _graphs_all
from tf_tempered.keras_bridge.code_origin import *  # noqa: F401,F403
from tf_tempered.keras_bridge.code_origin import __all__ as _code_origin_all
from tf_tempered.keras_bridge.input_axes import *  # noqa: F401,F403
from tf_tempered.keras_bridge.input_axes import __all__ as _input_axes_all
from tf_tempered.keras_bridge.runtime import __all__ as _runtime_all
from tf_tempered.keras_bridge.preprocessing import *  # noqa: F401,F403
from tf_tempered.keras_bridge.preprocessing import __all__ as _preprocessing_all
from tf_tempered.keras_bridge.saving_hooks import *  # noqa: F401,F403
from tf_tempered.keras_bridge.saving_hooks import __all__ as _saving_hooks_all

__all__ = [*_layers_all, *_variables_all, *_recurrent_all, *_losses_all, *_training_all,
           *_optimizers_all, *_datasets_all, *_tf_privacy_all, *_runtime_all, *_graphs_all,
           *_code_origin_all, *_input_axes_all, *_preprocessing_all, *_compiled_state_all,
           *_saving_hooks_all]
