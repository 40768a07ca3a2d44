"""Attribution methods for /saliency: one module each, registered in the order they are listed here.

To add a method, write one module beside these (its `MethodParams` and its `AttributionMethod`
decorated with `@register_method`) and add its name to the import below.
"""

from __future__ import annotations

# Registration: one module per method, in the order /saliency lists them.
# isort: off
from service.introspection.attribution import gradient  # noqa: F401
from service.introspection.attribution import input_x_gradient  # noqa: F401
from service.introspection.attribution import smoothgrad  # noqa: F401
from service.introspection.attribution import integrated_gradients  # noqa: F401
from service.introspection.attribution import gradcam  # noqa: F401
from service.introspection.attribution import occlusion  # noqa: F401
from service.introspection.attribution import feature_ablation  # noqa: F401
from service.introspection.attribution import guided_backprop  # noqa: F401
from service.introspection.attribution import deconvolution  # noqa: F401
from service.introspection.attribution import guided_gradcam  # noqa: F401
from service.introspection.attribution import deeplift  # noqa: F401
from service.introspection.attribution import gradient_shap  # noqa: F401
from service.introspection.attribution import layer_conductance  # noqa: F401
from service.introspection.attribution import layer_integrated_gradients  # noqa: F401
from service.introspection.attribution import neuron_gradient  # noqa: F401
from service.introspection.attribution import attention_rollout  # noqa: F401
from service.introspection.attribution import gradient_weighted_attention  # noqa: F401

# isort: on
from service.introspection.attribution.base import (
    AttributionMethod,
    MethodParams,
    SaliencyItem,
    method_named,
    registered_methods,
)
from service.introspection.attribution.run import compute_saliency

__all__ = [
    "AttributionMethod",
    "MethodParams",
    "SaliencyItem",
    "compute_saliency",
    "method_named",
    "registered_methods",
]
