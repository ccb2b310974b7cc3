"""Writes a two-method ExecuTorch program of the buffers design (``prefill`` + ``decode``, one DelegateCall each,
caches as mutable buffers) as a ``delegate-host`` TOML program around the same delegate blobs, so the blobs run
without an ExecuTorch runtime:

    python -m kv_delegate.to_program PROGRAM.pte DIR      # then: delegate-host run DIR/program.toml

Each call's arguments are taken from the ``.pte``: method inputs (``tokens``, ``input_pos``), the method output
(``logits``), mutable buffers by their fully qualified names, and the delegate outputs that ``copy_`` writes
back, as their buffers. A ``TensorRTBackend`` program gets device-memory buffers shaped ``[1, H, L, Dh]`` (as
kv-example-trt's example program declares them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List

from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.schema import DelegateCall, KernelCall

from .model import TINY

_DTYPES = {6: "f32", 4: "i64"}  # ExecuTorch ScalarType: Float, Long


def _toml_list(values: List[Any]) -> str:
    return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in values) + "]"


def convert(pte: Path, out: Path, prompt: List[int]) -> Path:
    """Writes ``prefill.blob``, ``decode.blob`` and ``program.toml`` (generating from ``prompt``, whose length
    must be prefill's row count) into ``out``; returns the manifest path."""
    program = deserialize_pte_binary(pte.read_bytes()).program
    plans = {plan.name: plan for plan in program.execution_plan}
    if set(plans) != {"prefill", "decode"}:
        raise ValueError(f"{pte}: methods {sorted(plans)}, expected prefill and decode")
    out.mkdir(parents=True, exist_ok=True)
    buffers: Dict[str, Dict[str, Any]] = {}
    lines: List[str] = []
    backend = ""
    for name in ("decode", "prefill"):
        plan = plans[name]
        values = plan.values
        fqn = {}
        for i, value in enumerate(values):
            info = getattr(value.val, "extra_tensor_info", None)
            if info is not None and info.fully_qualified_name:
                fqn[i] = info.fully_qualified_name
        instructions = [ins.instr_args for ins in plan.chains[0].instructions]
        calls = [ins for ins in instructions if isinstance(ins, DelegateCall)]
        if len(calls) != 1:
            raise ValueError(f"{pte} {name}: {len(calls)} DelegateCalls, expected one")
        write_back = {
            ins.args[1]: ins.args[0]
            for ins in instructions
            if isinstance(ins, KernelCall) and plan.operators[ins.op_index].name == "aten::copy_"
        }
        delegate = plan.delegates[calls[0].delegate_index]
        backend = delegate.id
        (out / f"{name}.blob").write_bytes(program.backend_delegate_data[delegate.processed.index].data)
        inputs = {plan.inputs[0]: "tokens", plan.inputs[1]: "input_pos"}
        args = []
        for arg in calls[0].args:
            if arg in inputs:
                args.append(f"input:{inputs[arg]}")
            elif arg in plan.outputs:
                args.append("output:logits")
            elif arg in fqn or write_back.get(arg) in fqn:
                buffer = fqn.get(arg) or fqn[write_back[arg]]
                tensor = values[arg if arg in fqn else write_back[arg]].val
                buffers[buffer] = {"dtype": _DTYPES[int(tensor.scalar_type)], "shape": list(tensor.sizes)}
                args.append(f"buffer:{buffer}")
            else:
                raise ValueError(f"{pte} {name}: delegate argument {arg} is no input, output or buffer")
        for io, index, tensor_name in (("inputs", plan.inputs[0], "tokens"), ("inputs", plan.inputs[1], "input_pos"),
                                       ("outputs", plan.outputs[0], "logits")):
            t = values[index].val
            lines += [f"[[methods.{name}.{io}]]", f'name = "{tensor_name}"',
                      f'dtype = "{_DTYPES[int(t.scalar_type)]}"', f"shape = {_toml_list(list(t.sizes))}", ""]
        lines += [f"[[methods.{name}.calls]]", f'blob = "{name}.blob"', f'backend = "{backend}"',
                  f"args = {_toml_list(args)}", ""]
    tensorrt = backend == "TensorRTBackend"
    head = ["format = 1", ""]
    for buffer, spec in sorted(buffers.items()):
        shape = ([1] if tensorrt else []) + spec["shape"]
        head += [f"[buffers.{buffer}]", f'dtype = "{spec["dtype"]}"', f"shape = {_toml_list(shape)}",
                 f'memory = "{"device" if tensorrt else "host"}"', ""]
    prompt_len = plans["prefill"].values[plans["prefill"].inputs[0]].val.sizes[0]
    if len(prompt) != prompt_len:
        raise ValueError(f"the prompt has {len(prompt)} tokens, prefill takes {prompt_len}")
    max_len = max(spec["shape"][1] for spec in buffers.values())
    tail = ["[generate]", 'prefill = "prefill"', 'decode = "decode"',
            f"prompt = {_toml_list(prompt)}", 'token_input = "tokens"',
            'position_input = "input_pos"', 'logits_output = "logits"', f"max_positions = {max_len}", ""]
    manifest = out / "program.toml"
    manifest.write_text("\n".join(head + lines + tail))
    return manifest


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pte", type=Path)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--prompt", type=lambda s: [int(t) for t in s.split(",")], default=list(TINY["prompt"]),
                    help="comma-separated prompt (default: the tiny model's)")
    args = ap.parse_args(argv)
    print(f"wrote {convert(args.pte, args.dir, args.prompt)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
