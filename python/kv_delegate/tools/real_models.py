"""Exports real decoders with the reference partitioner and reports what the delegate takes (docs/real-models.md).

    KV_DELEGATE_PACK=target/debug/delegate-pack PYTHONPATH=python/kv_delegate:python/kv_delegate/tests \\
      .cache/export-venv/bin/python python/kv_delegate/tools/real_models.py OUT_DIR

For a tiny random-weight (seeded) Hugging Face ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (GQA on), exported
with transformers' own ExecuTorch recipe (``convert_and_export_with_cache``, StaticCache), and for the
hand-written Llama-style module of ``kv_delegate/llama_style.py``: the edge operators of the graph (with dtypes and
shapes), what the partitioner claims and what it leaves outside with the reason, and whether the ``.pte`` is
written. Writes ``OUT_DIR/<model>.pte`` and prints a report.
"""

from __future__ import annotations

import collections
import logging
import sys
import traceback
from pathlib import Path

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower

from kv_delegate import KvAliasMemoryPlanningPass, ReferencePartitioner
from kv_delegate.lowering import op_name

MAX_LEN = 16


def hf_model(kind: str):
    import transformers

    torch.manual_seed(18)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(config)
    model.eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.cache_config = {"batch_size": 1, "max_cache_len": MAX_LEN, "device": "cpu"}
    return model


def export_hf(model):
    from transformers.integrations.executorch import convert_and_export_with_cache

    with torch.no_grad():
        return convert_and_export_with_cache(
            model, example_input_ids=torch.tensor([[1]], dtype=torch.long),
            example_cache_position=torch.tensor([0], dtype=torch.long))


def export_hand():
    from kv_delegate.llama_style import LlamaStyle

    model = LlamaStyle().eval()
    with torch.no_grad():
        return torch.export.export(model, (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)),
                                   strict=False)


def describe(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).replace('torch.', '')} {list(val.shape)}"
    return type(val).__name__


def report(name: str, ep, out: Path) -> None:
    print(f"\n## {name}\n")
    with torch.no_grad():
        edge = to_edge(ep).exported_program()
    ops = collections.Counter()
    shapes = collections.defaultdict(set)
    for node in edge.graph.nodes:
        if node.op == "call_function":
            ops[op_name(node)] += 1
            shapes[op_name(node)].add(describe(node))
    print("edge ops (count, output dtypes/shapes):")
    for op, n in sorted(ops.items()):
        print(f"  {op} x{n}: {', '.join(sorted(shapes[op])[:4])}")
    partitioner = ReferencePartitioner(output_names=["logits"])
    try:
        with torch.no_grad():
            lowered = to_edge_transform_and_lower(ep, partitioner=[partitioner])
            graph = lowered.exported_program().graph
            calls = sum(1 for n in graph.nodes if op_name(n).endswith("executorch_call_delegate"))
            program = lowered.to_executorch(ExecutorchBackendConfig(
                emit_mutable_buffer_names=True, memory_planning_pass=KvAliasMemoryPlanningPass()))
        (out / f"{name}.pte").write_bytes(program.buffer)
        print(f"exported: {len(program.buffer)} bytes, {calls} delegate call(s), "
              f"{len(partitioner.unsupported())} node(s) outside")
    except Exception:  # noqa: BLE001 - a report, not a test
        print("export FAILED:\n" + traceback.format_exc(limit=3))
    by_reason = collections.Counter((o.op, o.reason if "not an operator" not in o.reason else "no rule")
                                    for o in partitioner.unsupported())
    print("outside (op, reason, count):")
    for (op, reason), n in sorted(by_reason.items()):
        print(f"  {op} x{n}: {reason}")


def main() -> int:
    logging.basicConfig(level=logging.ERROR)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    which = sys.argv[2:] or ["hand", "llama", "qwen2"]
    for name in which:
        try:
            ep = export_hand() if name == "hand" else export_hf(hf_model(name))
        except Exception:  # noqa: BLE001
            print(f"\n## {name}\n\ntorch.export FAILED:\n" + traceback.format_exc(limit=4))
            continue
        report(name, ep, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
