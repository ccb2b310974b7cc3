"""``ReferencePartitioner``: tags the nodes the reference delegate runs, as the lowering decides, and reports the
ones it leaves outside with the reason.

One source of truth: a node is claimed only when the lowering (:mod:`kv_delegate.lowering`) takes it in that
exact form. The partitioner proposes the connected groups of nodes whose operator has a lowering rule, then
dry-runs each group as ExecuTorch will hand it to ``preprocess`` (the same subprogram, built by ExecuTorch's own
``create_submodule_from_nodes`` / ``create_exported_program_from_submodule`` on a copy of the program), lowers it
and has the packer check it. A node the lowering or the packer refuses leaves the claim with the reason, and the
groups are proposed again, until every group lowers. So an export never fails because of a node claimed here;
what is left outside runs on ExecuTorch's kernels, named by :meth:`~ReferencePartitioner.unsupported` with its
cause (:mod:`kv_delegate.outside`).

``sdpa`` and ``rms_norm`` have no portable kernel: ``ops_to_not_decompose`` keeps one whole only where the
partition claims it, decided by a first pass on the edge program ExecuTorch will make (:meth:`_decide`,
:mod:`kv_delegate.keep_whole`); one the delegate cannot take is decomposed and its parts partitioned like any
node. So an export never aborts on a node the delegate cannot take.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .keep_whole import KEPT_WHOLE, RMS_NORM, SDPA, edge_program, has_form, source
from .lowering import LoweringError, lower, op_name, rule_names
from .outside import Outside, at_split, is_outside, no_rule, part_of, reason_of, value_of, with_causes
from .names import BUFFER_META, CACHE_META, CUDA_BACKEND, OUTPUT_NAME_META, REFERENCE_BACKEND, TENSORRT_BACKEND
from .pack import PackError, check, packer

log = logging.getLogger("kv_delegate")

#: Edge operators the lowering takes (a rule, or folded at export; see :mod:`kv_delegate.lowering`). Being one
#: makes a node a candidate; the dry run decides whether it is claimed.
SUPPORTED_OPS = rule_names()

#: The most dry-run rounds before the partitioner gives up claiming anything (each round leaves at least one
#: more node outside, so this bounds the work on a pathological graph).
MAX_ROUNDS = 256


def cache_out_name(cache: str) -> str:
    """The reference-graph name of a cache's updated value: ``k_cache_0`` -> ``k_cache_out_0`` (kv-example's)."""
    match = re.fullmatch(r"(.*)_(\d+)", cache)
    return f"{match.group(1)}_out_{match.group(2)}" if match else f"{cache}_out"


def _annotate_buffers(ep: ExportedProgram) -> None:
    """Marks every mutable buffer that is not a cache but is overwritten each call (Hugging Face StaticCache's
    ``cumulative_length``: ``copy(buffer, cache_position[0])``, then ``+ 1``) with :data:`BUFFER_META`: the
    ``copy`` nodes that read it (so the delegate input is named after the buffer) and the node computing its new
    value (which the lowering writes into the buffer in place with an ``assign``). Only a buffer whose every
    reader is a ``copy`` into it qualifies: ``copy`` reads nothing of its destination but the shape, so writing
    the buffer in place during the call changes no value any node reads."""
    sig = ep.graph_signature
    placeholders = {node.name: node for node in ep.graph.nodes if node.op == "placeholder"}
    buffer_of = {placeholder: buffer for placeholder, buffer in sig.inputs_to_buffers.items()}
    outputs = ep.graph.output_node().args[0]
    for spec, arg in zip(sig.output_specs, outputs):
        if spec.kind != OutputKind.BUFFER_MUTATION or not isinstance(arg, torch.fx.Node) or CACHE_META in arg.meta:
            continue
        buffer = spec.target
        placeholder = next((placeholders[p] for p, b in buffer_of.items() if b == buffer and p in placeholders), None)
        if placeholder is None or not placeholder.users:
            continue
        if not all(op_name(user) == "aten.copy.default" and user.args[0] is placeholder
                   and placeholder not in user.args[1:] for user in placeholder.users):
            continue
        for user in placeholder.users:
            user.meta[BUFFER_META] = {"buffer": buffer}
        arg.meta[BUFFER_META] = {"buffer": buffer, "out": cache_out_name(buffer)}


class _Support(OperatorSupportBase):
    """Node support: the op has a lowering rule and no dry run has refused the node."""

    def __init__(self, refused: Dict[str, str]) -> None:
        super().__init__()
        self.refused = refused

    def is_node_supported(self, submodules: object, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and op_name(node) in SUPPORTED_OPS and node.name not in self.refused


class ReferencePartitioner(Partitioner):
    """Partitions an edge program for ``ReferenceBackend``.

    Args:
        owned_state: move the mutable buffers the delegate updates into the delegate
            (``tag_mutated_buffer``): they become reference-graph ``state`` and leave the call's arguments.
        output_names: names of the method's user outputs, in order (e.g. ``["logits"]``); the blob binds the
            delegate outputs that produce them under these names (default: the node names).
    """

    #: The backend the partitions are for.
    backend_id = REFERENCE_BACKEND

    def __init__(self, owned_state: bool = False, output_names: Sequence[str] = ()) -> None:
        super().__init__()
        self.owned_state = owned_state
        self.output_names = list(output_names)
        self.delegation_spec = DelegationSpec(self.backend_id, [])
        self._outside: List[Outside] = []
        #: What :meth:`_decide` found, one per program it saw (a method each).
        self._decisions: List[_Decision] = []

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> Tuple[List[torch._ops.OpOverload], Optional[Callable[[torch.fx.Node], bool]]]:
        """Keeps ``aten.rms_norm`` and ``aten.scaled_dot_product_attention`` whole (one reference-graph op each)
        when they have the exact form the lowering takes (:func:`~kv_delegate.keep_whole.keeps_sdpa`,
        :func:`~kv_delegate.keep_whole.keeps_rms_norm`) and the partition of the program claims them
        (:meth:`_decide`, run when ExecuTorch first asks about one); any other is decomposed by ExecuTorch and its
        parts are partitioned like any node, so a node kept whole is never left without a kernel."""
        decided: List[Dict[str, bool]] = []

        def keep(node: torch.fx.Node) -> bool:
            if node.target not in (SDPA, RMS_NORM):
                return True
            if not has_form(node, SUPPORTED_OPS):
                return False
            if not decided:
                decided.append(self._decide(ep))
            return decided[0].get(source(node), False)

        return ([RMS_NORM, SDPA], keep)

    def _decide(self, program: ExportedProgram) -> Dict[str, bool]:
        """The first pass: which ``sdpa`` and ``rms_norm`` nodes of ``program`` (an ATen program) stay whole, by
        :func:`~kv_delegate.keep_whole.source` name. Makes the edge program ExecuTorch will make
        (:func:`~kv_delegate.keep_whole.edge_program`) and partitions it; a node kept whole that is left outside
        (the delegate refuses it, or what it reads, such as the causal mask, is computed in another delegate
        call) is decomposed instead, and the program is made and partitioned again, until every node kept whole
        is claimed. The last partition, made with the real weights and constants, is what :meth:`partition`
        claims on the same edge program (ExecuTorch hands it over with fake ones)."""
        candidates = [n for n in program.graph.nodes
                      if n.op == "call_function" and n.target in (SDPA, RMS_NORM) and has_form(n, SUPPORTED_OPS)]
        kept = {source(n) for n in candidates}
        decomposed: Dict[str, str] = {}
        causes: Set[str] = set()
        while True:  # each pass decomposes at least one more node, so at most len(kept) + 1 passes
            edge = edge_program(program, kept - set(decomposed))
            self._annotate(edge)
            refused, groups, found = self._claim(edge, decomposed, causes)
            causes |= found
            claimed = {name for names in groups.values() for name in names}
            left = [n for n in edge.graph.nodes if is_outside(n, claimed) and op_name(n) in KEPT_WHOLE]
            if not {source(n) for n in left} - set(decomposed):
                break  # nothing more to decompose (partition names what is left)
            for node in left:
                decomposed[source(node)] = refused.get(node.name) or no_rule(op_name(node))
        self._decisions.append(_Decision(_signature(edge), refused, decomposed))
        return {name: name not in decomposed for name in kept}

    def unsupported(self) -> List[Outside]:
        """Every node the last :meth:`partition` left outside the delegate: ``(node, op, value, reason)``
        (:class:`Outside`; ``str()`` of one is the sentence the log shows)."""
        return list(self._outside)

    def _annotate(self, ep: ExportedProgram) -> None:
        """Names the caches after their buffers, marks the other mutable buffers the delegate may write in place
    (:func:`_annotate_buffers`) and names the user outputs after ``output_names``."""
        sig = ep.graph_signature
        buffers = sig.inputs_to_buffers
        mutated = set(sig.buffers_to_mutate.values())
        for node in ep.graph.nodes:
            if op_name(node) in ("aten.index_put.default", "aten.index_copy.default") and node.args:
                target = buffers.get(getattr(node.args[0], "name", None))
                if target in mutated:
                    node.meta[CACHE_META] = {"cache": target, "out": cache_out_name(target)}
        _annotate_buffers(ep)
        outputs = ep.graph.output_node().args[0]
        user = [arg for spec, arg in zip(sig.output_specs, outputs) if spec.kind == OutputKind.USER_OUTPUT]
        for name, arg in zip(self.output_names, user):
            if isinstance(arg, torch.fx.Node):
                arg.meta[OUTPUT_NAME_META] = name

    def _propose(self, ep: ExportedProgram, refused: Dict[str, str]) -> Dict[str, List[str]]:
        """Connected groups of candidate nodes (not refused), by tag: node names."""
        partitions = CapabilityBasedPartitioner(
            ep.graph_module, _Support(refused), allows_single_node_partition=True
        ).propose_partitions()
        return {f"{self.backend_id}_{p.id}": [n.name for n in p.nodes] for p in partitions}

    def _dry_run(self, ep: ExportedProgram, groups: Dict[str, List[str]]) -> Dict[str, str]:
        """Builds every group's subprogram as ExecuTorch will (on a copy of ``ep``), lowers it and has the packer
        check it: ``{node: reason}`` of the nodes that must leave the claim (empty when every group lowers)."""
        from executorch.exir.backend.backend_api import _get_node_list_with_same_tag
        from executorch.exir.lowered_backend_module import (
            create_exported_program_from_submodule,
            create_submodule_from_nodes,
        )

        # The weights are shared, not copied: the dry run only reads them.
        memo: Dict[int, object] = {}
        for tensor in list(ep.state_dict.values()) + list(ep.constants.values()):
            memo[id(tensor)] = tensor
        copied: ExportedProgram = copy.deepcopy(ep, memo)
        real = {**ep.state_dict, **ep.constants}
        tag_of = {name: tag for tag, names in groups.items() for name in names}
        for node in copied.graph.nodes:
            node.meta.pop("delegation_tag", None)
            if node.name in tag_of:
                node.meta["delegation_tag"] = tag_of[node.name]
        tag_constant_data(copied)
        if self.owned_state:
            tag_mutated_buffer(copied)
        try:
            tool: Optional[str] = packer()
        except PackError:
            tool = None  # no packer here: the lowering alone decides (preprocess will need one)
        refused: Dict[str, str] = {}
        gm = copied.graph_module
        for tag, names in groups.items():
            try:
                nodes = _get_node_list_with_same_tag(gm, tag, copied)
                with gm._set_replace_hook(copied.graph_signature.get_replace_hook()):
                    submodule, call = create_submodule_from_nodes(gm, nodes, tag)
                sub, _, _ = create_exported_program_from_submodule(submodule, copied, tag, call, False)
            except Exception as err:  # ExecuTorch cannot cut this group out: claim none of it
                for name in names:
                    refused[name] = f"its group of {len(names)} nodes cannot be cut out of the program ({err})"
                continue
            try:
                lowered = lower(sub, real)
            except LoweringError as err:
                if err.node is not None and err.node in tag_of:
                    refused[err.node] = err.reason
                else:
                    for name in names:
                        refused[name] = f"its group does not lower: {err.reason}"
                continue
            except Exception as err:  # noqa: BLE001 - whatever the lowering trips on, the group is not claimed
                for name in names:
                    refused[name] = f"its group does not lower ({type(err).__name__}: {err})"
                continue
            if not lowered.description.ops:
                for name in names:
                    refused[name] = "only layout changes and index arithmetic: nothing for the delegate to compute"
                continue
            if tool is None:
                continue
            try:
                # The reference packer checks the graph every delegate of this family runs (TensorRT's too).
                check(lowered, REFERENCE_BACKEND, tool=tool)
            except PackError as err:
                culprit = _culprit(str(err), lowered.description.op_nodes)
                detail = re.sub(r"^(error: )?(the graph: )?", "", str(err).split(": ", 1)[-1])
                detail = re.sub(r" \[\w+\]$", "", detail)  # the error code's name
                reason = f"the reference graph refuses it: {detail}"
                if culprit is not None and culprit in tag_of:
                    refused[culprit] = reason
                else:
                    for name in names:
                        refused[name] = reason
        return refused

    def _claim(self, ep: ExportedProgram, decomposed: Dict[str, str],
               causes: Set[str]) -> Tuple[Dict[str, str], Dict[str, List[str]], Set[str]]:
        """The groups that lower (module docs): ``({node: why it is left outside}, {tag: node names}, causes)``;
        the reason of a node refused where the graph is split names what splits it, the causes
        (:func:`~kv_delegate.outside.with_causes`; ``decomposed`` and ``causes``: :meth:`_decide`'s so far)."""
        refused: Dict[str, str] = {}
        split: Set[str] = set()
        groups: Dict[str, List[str]] = {}
        for _ in range(MAX_ROUNDS):
            groups = self._propose(ep, refused)
            new = {k: v for k, v in self._dry_run(ep, groups).items() if k not in refused}
            if not new:
                break
            split |= at_split(ep.graph, groups, new)
            refused.update(new)
        else:
            for names in groups.values():
                refused.update({n: f"not claimed: no stable partition after {MAX_ROUNDS} rounds" for n in names})
            groups = {}
        claimed = {name for names in groups.values() for name in names}
        reasons, found = with_causes(ep.graph, refused, split, claimed, decomposed, causes)
        return reasons, groups, found

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Claims what lowers (module docs), tags the constants the claimed nodes read and (``owned_state``)
        the caches; logs every node left outside with the reason. On the edge program :meth:`_decide` made
        (``to_edge_transform_and_lower``), its partition is claimed as it is."""
        ep = exported_program
        self._annotate(ep)
        self.delegation_spec = DelegationSpec(self.backend_id, _compile_specs(ep))
        signature = _signature(ep)
        decision = next((d for d in reversed(self._decisions) if d.signature == signature), None)
        if decision is not None:
            refused, groups = dict(decision.refused), self._propose(ep, decision.refused)
        else:
            refused, groups, _ = self._claim(ep, {}, set())
        decomposed = decision.decomposed if decision is not None else {}
        tags: Dict[str, DelegationSpec] = {}
        tag_of = {name: tag for tag, names in groups.items() for name in names}
        claimed = set(tag_of)
        self._outside = []
        for node in ep.graph.nodes:
            if node.name in tag_of:
                node.meta["delegation_tag"] = tag_of[node.name]
                tags[tag_of[node.name]] = self.delegation_spec
            elif is_outside(node, claimed):
                op = op_name(node)
                reason = part_of(node, decomposed, SUPPORTED_OPS) or refused.get(node.name) or no_rule(op)
                self._outside.append(Outside(node.name, op, value_of(node), reason_of(node, reason)))
        tag_constant_data(ep)
        if self.owned_state:
            tag_mutated_buffer(ep)
        for outside in self._outside:
            log.warning("kv_delegate: not delegated to %s: %s", self.backend_id, outside)
        kept = [o for o in self._outside if o.op in KEPT_WHOLE]
        if kept:
            # Only an edge program not made by to_edge_transform_and_lower from the program _decide() saw.
            raise RuntimeError(
                f"kv_delegate: {kept[0]}; ExecuTorch has no kernel for {kept[0].op} and it was kept whole for "
                f"{self.backend_id}: export with to_edge_transform_and_lower(..., partitioner=[...]) and the default "
                "EdgeCompileConfig, so that the partitioner decides before ExecuTorch decomposes the program"
            )
        log.info("kv_delegate: %d partition(s) for %s, %d node(s) left outside", len(tags), self.backend_id,
                 len(self._outside))
        return PartitionResult(tagged_exported_program=ep, partition_tags=tags)


class _Decision(NamedTuple):
    """What :meth:`ReferencePartitioner._decide` found for one edge program."""

    #: The edge program's nodes, ``(name, operator)`` in order: the program this partition is for.
    signature: Tuple[Tuple[str, str], ...]
    #: The nodes left outside the claim, with why.
    refused: Dict[str, str]
    #: The nodes that were not kept whole after all (by source name), with why the delegate refused them.
    decomposed: Dict[str, str]


def _signature(ep: ExportedProgram) -> Tuple[Tuple[str, str], ...]:
    return tuple((n.name, op_name(n) if n.op == "call_function" else n.op) for n in ep.graph.nodes)


def _compile_specs(ep: ExportedProgram) -> List[CompileSpec]:
    """``max_seq_len``: the positions the caches hold (the shortest cache's row axis, ``[H, L, Dh]``), so a
    runtime knows how far a generation may run (``delegate-host`` reads it as ``max_positions``)."""
    rows = []
    for node in ep.graph.nodes:
        cache = node.args[0] if node.meta.get(CACHE_META) and node.args else None
        val = cache.meta.get("val") if isinstance(cache, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dim() >= 2:
            rows.append(int(val.shape[-2]))
    return [CompileSpec("max_seq_len", str(min(rows)).encode())] if rows else []


def _culprit(message: str, op_nodes: Sequence[Optional[str]]) -> Optional[str]:
    """The fx node behind the reference-graph op a packer message names (``op 3 (add): ...``)."""
    match = re.search(r"\bop (\d+)\b", message)
    if match and int(match.group(1)) < len(op_nodes):
        return op_nodes[int(match.group(1))]
    return None


class CudaPartitioner(ReferencePartitioner):
    """:class:`ReferencePartitioner` for ``CudaBackend``: the same claim, blobs for the CUDA delegate."""

    backend_id = CUDA_BACKEND


class TensorRTPartitioner(ReferencePartitioner):
    """:class:`ReferencePartitioner` for ``TensorRTBackend`` (same ops). A TensorRT engine keeps no state between
    executions, so ``owned_state`` is refused."""

    backend_id = TENSORRT_BACKEND

    def __init__(self, owned_state: bool = False, output_names: Sequence[str] = ()) -> None:
        if owned_state:
            raise ValueError("TensorRTBackend cannot own caches: export them as program buffers")
        super().__init__(owned_state=False, output_names=output_names)
