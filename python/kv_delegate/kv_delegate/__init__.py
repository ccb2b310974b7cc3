"""kv_delegate: ExecuTorch ahead-of-time support for the kv-delegate project's delegates.

- :class:`ReferencePartitioner` tags what the CPU reference delegate runs, :class:`ReferenceBackend` lowers it to a
  reference-graph payload inside a native blob (written by the Rust packer ``delegate-pack``);
  :class:`CudaPartitioner` / :class:`CudaBackend` write the same blobs for the CUDA delegate;
  :class:`TensorRTPartitioner` / :class:`TensorRTBackend` build the same lowered graph into a TensorRT-RTX engine.
- :class:`KvAliasMemoryPlanningPass` places each delegate KV output on its mutable buffer's storage.
- :mod:`kv_delegate.model` is kv-example's decoder in torch; :mod:`kv_delegate.export` writes the fixtures.
"""

__version__ = "0.1.0"

from .backend import CudaBackend, ReferenceBackend, TensorRTBackend  # noqa: E402
from .partitioner import CudaPartitioner, ReferencePartitioner, TensorRTPartitioner  # noqa: E402
from .planning import KvAliasMemoryPlanningPass  # noqa: E402

__all__ = [
    "CudaBackend",
    "CudaPartitioner",
    "ReferenceBackend",
    "ReferencePartitioner",
    "TensorRTBackend",
    "TensorRTPartitioner",
    "KvAliasMemoryPlanningPass",
    "__version__",
]
