"""Names shared by the partitioner and the lowering: the node-meta keys that carry binding names."""

#: Node meta of a cache update (``index_put``/``index_copy``): ``{"cache": "k_cache_0", "out":
#: "k_cache_out_0"}``, the reference-graph names of the cache input and the updated cache.
CACHE_META = "kv_delegate_cache"

#: Node meta of a mutable buffer that is not a cache but is overwritten each call (Hugging Face StaticCache's
#: ``cumulative_length``): on the ``copy`` nodes that read the buffer, ``{"buffer": "cumulative_length_0"}``
#: (the buffer input is named after it); on the node computing the buffer's new value, also ``"out":
#: "cumulative_length_out_0"``, the name of the ``assign`` that writes it into the buffer in place.
BUFFER_META = "kv_delegate_buffer"

#: Node meta of a node whose value is a method output: the method's output name (e.g. ``logits``).
OUTPUT_NAME_META = "kv_delegate_name"

#: The backend id of the CPU reference delegate (the class name of its ``BackendDetails``).
REFERENCE_BACKEND = "ReferenceBackend"

#: The backend id of the CUDA delegate (same reference-graph payload, run on an NVIDIA GPU).
CUDA_BACKEND = "CudaBackend"

#: The backend id of the TensorRT delegate.
TENSORRT_BACKEND = "TensorRTBackend"

#: Key of a lowered module's ``_delegate_info_meta``: ``{output index: input index}`` of the delegate's KV
#: outputs that alias a cache input, and of its ``assign`` outputs that alias the buffer they overwrite (what
#: :class:`kv_delegate.KvAliasMemoryPlanningPass` places together).
ALIASES_META = "kv_aliases"
