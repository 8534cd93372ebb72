"""Split backward: a chunk's backward as two actions, B (input gradient) and W (weights).

Zero-bubble pipeline parallelism (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
sec. 2.1) splits each microbatch's backward in two:

- B, the gradient of the stage input: the previous stage waits for it, so it stays on the
  critical path of the pipeline;
- W, the weight gradients: nothing needs them before the optimizer step, so a schedule moves
  them into the slots where a stage would otherwise sit idle (the bubble).

The cost argument. For a linear layer y = x A^T the backward is two matmuls of the forward's
size: dx = dy A (B) and dA = dy^T x (W), so B and W each cost about one forward F, and a fused
backward about 2F (Qi et al., sec. 2.1, table 1). Computed naively, W is a second
`autograd.grad(outputs, weights)`: to reach the first block's weights, it must carry dx back
through every later block again, so it costs a whole backward (2F) and B + W costs 3F. Here W
starts where each weight's branch leaves the input's path, from the gradients B saw there, and
computes only the dA matmuls: B + W costs about 2F, as the fused backward does. (B takes
more than half: attention's core and the norms' input gradients have no weight side.) What
is left over is memory: B keeps the gradients W starts from, so the engine cannot reuse that
memory while it is hot (measured: docs/pipelines.md, "Split backward: B and W").

How W finds where to start: a walk over the autograd graph after the forward.

- The *input path* holds the nodes from which the stage input is reachable: B runs them.
- The *weight side* holds the nodes off the input path from which a weight is reachable:
  only W needs them.
- A *cut node* is an input-path node with a child on the weight side: a Linear's
  `MmBackward0` (children: the input path, and `TBackward0` leading to the weight), an
  RMSNorm's `MulBackward0` by its weight.

The autograd engine computes only the outputs of a node that lead to the requested `inputs`,
so in B (inputs: the stage input) a cut node computes dx and skips dA. A hook records the
gradient each cut node receives; W replays the cut nodes from those gradients with the weights
as `inputs`, so this time they compute dA and skip dx. (PyTorch's pipelining helpers,
`torch.distributed.pipelining._backward`, work the same way.)

W runs one backward call per *group*: cut nodes whose weight sides touch (a weight reached
from two cut nodes, such as a tied weight, or one cast once by autocast and used twice) share
a call, so the weight is accumulated once and its post-accumulate hook, where data parallelism
counts a bucket's ready gradients, fires once; cut nodes in different groups run in separate
calls whose `inputs` are only their group's weights, so the engine computes no dx below them.
(One call over every cut node would carry dx down from each cut node to the ones below it:
a whole backward again.) A group whose cut nodes lie at two depths of the input path (one
weight used twice) would carry gradient from the upper cut node to the lower one: a hook pins
each cut node's incoming gradient to what B recorded, so nothing counts twice.

Activation recompute (`torch.utils.checkpoint`, non-reentrant) recomputes a region once per
backward call that needs it: once in B and, under one `GraphExecGroup`, once for all of W's
calls (not once per call). With full recompute, B + W therefore costs one forward more than a
fused backward; selective recompute costs nothing more, as W never needs the attention core
it recomputes.

Memory: B keeps the graph (`retain_graph=True`) for W, so a chunk whose W is pending holds its
activations, including those only B needed (eager autograd cannot free a node's saved tensors
selectively), and the gradients B recorded; W frees them. On CPU, holding more memory at once
costs glibc's malloc page faults where it maps fresh memory (`dist/host_memory.py` pins the
mmap threshold on CPU ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge
from torch.utils.checkpoint import GraphExecGroup

from paraxis.spec.errors import ParaxisError

# The gradients a node received in B, one entry per output of its forward (None: no gradient).
Grads = tuple[torch.Tensor | None, ...]


class _WeightCall:
    """One backward call of W: roots (cut nodes, or the whole output), their gradients, and
    the weights it accumulates."""

    def __init__(self, cut_nodes: list[Node], weights: list[torch.Tensor]) -> None:
        self.cut_nodes = cut_nodes
        self.weights = weights
        self.received: dict[int, Grads] = {}  # cut node's position -> what it got in B
        self.roots: list[torch.Tensor | GradientEdge] = []
        self.root_grads: list[torch.Tensor | None] = []

    def record(self, position: int) -> Callable[[Grads], None]:
        """A node prehook that keeps the gradients cut node `position` receives in B."""
        def hook(grad_outputs: Grads) -> None:
            self.received[position] = grad_outputs
        return hook

    def pin(self, position: int) -> Callable[[Grads], Grads]:
        """A node prehook that replaces what cut node `position` receives in W by what it
        received in B."""
        recorded = self.received[position]
        return lambda _: recorded

    def gather_roots(self) -> None:
        """After B: one root per (cut node, output) that received a gradient."""
        for position, node in enumerate(self.cut_nodes):
            for output, grad in enumerate(self.received.get(position, ())):
                if grad is not None:
                    self.roots.append(GradientEdge(node, output))
                    self.root_grads.append(grad)

    def run(self) -> None:
        if not self.roots:
            return
        handles = []
        if len(self.cut_nodes) > 1:
            # Pin each cut node to its B gradient: gradient carried down the input path from
            # a cut node above must not add to it (see the module docstring).
            handles = [node.register_prehook(self.pin(position))
                       for position, node in enumerate(self.cut_nodes)
                       if position in self.received]
        try:
            torch.autograd.backward(self.roots, self.root_grads, inputs=self.weights)
        finally:
            for handle in handles:
                handle.remove()


class PendingWeightGrad:
    """What B leaves for W: where to restart the backward, with which gradients, for which
    weights. `run()` is W; until then the chunk's autograd graph (and its activations) stays
    alive."""

    def __init__(self, calls: list[_WeightCall]) -> None:
        self._calls: list[_WeightCall] | None = calls

    def kept_bytes(self) -> int:
        """Bytes of the gradients B kept for W (each storage once): what the planner prices
        beside the activations (`plan.activations.weight_grad_input_values`)."""
        seen: dict[int, int] = {}
        for call in self._calls or ():
            for grad in call.root_grads:
                if grad is not None:
                    storage = grad.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def run(self) -> None:
        """W: accumulate the weight gradients into .grad (firing post-accumulate-grad hooks),
        then let go of the graph."""
        if self._calls is None:
            raise ParaxisError("this weight gradient has already been computed (W runs once "
                               "per B); call backward_input again for a new backward")
        calls, self._calls = self._calls, None
        # One recompute of each checkpointed block for all of W's calls, not one per call:
        # the calls touch disjoint nodes, which is what GraphExecGroup asks.
        with GraphExecGroup():
            for call in calls:
                call.run()


def backward_input(outputs: torch.Tensor, grad_outputs: torch.Tensor | None,
                   inputs: torch.Tensor | None, weights: Sequence[torch.Tensor]
                   ) -> tuple[torch.Tensor | None, PendingWeightGrad]:
    """B: the gradient of `inputs` (the stage input) from `outputs` and their gradient
    (`grad_outputs`; None for a scalar loss), without the weights' gradients, which
    `PendingWeightGrad.run()` (W) accumulates into `weights`' .grad later.

    `inputs.grad` is not touched: the gradient is returned (None when `inputs` is None or
    needs no gradient, as the first stage's token ids do; then W runs the whole backward).
    `weights` are every tensor of the chunk that should get a gradient (its parameters): a
    leaf left out gets none, in B or in W.
    """
    trainable = [w for w in weights if w.requires_grad]
    if outputs.grad_fn is None or inputs is None or not inputs.requires_grad:
        return None, _whole_backward(outputs, grad_outputs, trainable)
    weight_nodes = {get_gradient_edge(w).node: w for w in trainable}
    input_node = get_gradient_edge(inputs).node
    graph = _Graph(outputs.grad_fn, input_node)
    input_path = graph.reaching({input_node})
    if outputs.grad_fn not in input_path:  # the output does not depend on the input
        return None, _whole_backward(outputs, grad_outputs, trainable)
    calls = _merge_overlapping(_group_cut_nodes(graph, input_path, weight_nodes), graph,
                               input_path)
    handles = [node.register_prehook(call.record(position))
               for call in calls for position, node in enumerate(call.cut_nodes)]
    try:
        (grad_input,) = torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()
    for call in calls:
        call.gather_roots()
    return grad_input, PendingWeightGrad(calls)


def _whole_backward(outputs: torch.Tensor, grad_outputs: torch.Tensor | None,
                    weights: list[torch.Tensor]) -> PendingWeightGrad:
    """Nothing to split: B computes nothing and W is the whole backward, into `weights`."""
    call = _WeightCall([], weights)
    if outputs.grad_fn is not None and weights:
        call.roots, call.root_grads = [outputs], [grad_outputs]
    return PendingWeightGrad([call])


class _Graph:
    """The autograd graph below a chunk's output, down to (not beyond) its input's node."""

    def __init__(self, root: Node, stop: Node) -> None:
        # Depth-first, children in order: the same on every rank, which keeps W's calls (and
        # any collective inside them, as tensor parallelism's) in one order everywhere.
        self.order: list[Node] = []
        self.children: dict[Node, list[Node]] = {}
        self.parents: dict[Node, list[Node]] = {}
        stack = [root]
        while stack:
            node = stack.pop()
            if node in self.children:
                continue
            kids = [] if node is stop else [n for n, _ in node.next_functions if n is not None]
            self.children[node] = kids
            self.order.append(node)
            for kid in kids:
                self.parents.setdefault(kid, []).append(node)
            stack.extend(reversed(kids))

    def reaching(self, targets: set[Node], within: set[Node] | None = None) -> set[Node]:
        """The nodes (of `within`, default all) from which one of `targets` is reachable,
        the targets included."""
        return self._closure(targets, self.parents, within)

    def below(self, starts: set[Node], within: set[Node]) -> set[Node]:
        """The nodes of `within` reachable from `starts`, the starts included."""
        return self._closure(starts, self.children, within)

    def _closure(self, starts: set[Node], edges: dict[Node, list[Node]],
                 within: set[Node] | None) -> set[Node]:
        found = {node for node in starts if node in self.children}
        frontier = list(found)
        while frontier:
            for node in edges.get(frontier.pop(), ()):
                if node not in found and (within is None or node in within):
                    found.add(node)
                    frontier.append(node)
        return found


def _group_cut_nodes(graph: _Graph, input_path: set[Node],
                     weight_nodes: dict[Node, torch.Tensor]) -> list[_WeightCall]:
    """The cut nodes, grouped by touching weight sides, each group with its weights."""
    off_path = {node for node in graph.order if node not in input_path}
    weight_side = graph.reaching(set(weight_nodes), within=off_path)
    # Union-find over nodes: a cut node joins the weight-side nodes below it, and so does
    # every weight-side node; cut nodes that meet anywhere end up with one representative.
    leader: dict[Node, Node] = {}

    def find(node: Node) -> Node:
        leader.setdefault(node, node)
        while leader[node] is not node:
            leader[node] = leader[leader[node]]
            node = leader[node]
        return node

    cut_nodes = []
    for node in graph.order:
        below = [kid for kid in graph.children[node] if kid in weight_side]
        if below and node in input_path:
            cut_nodes.append(node)
        if below and (node in input_path or node in weight_side):
            for kid in below:
                leader[find(kid)] = find(node)
    calls: dict[Node, _WeightCall] = {}  # by leader, in the order the walk met them
    for node in cut_nodes:
        calls.setdefault(find(node), _WeightCall([], [])).cut_nodes.append(node)
    for node in graph.order:
        if node in weight_nodes:
            calls[find(node)].weights.append(weight_nodes[node])
    return list(calls.values())


def _merge_overlapping(calls: list[_WeightCall], graph: _Graph,
                       input_path: set[Node]) -> list[_WeightCall]:
    """Merge the calls that would run a node twice.

    A call whose cut nodes lie at several depths also runs the input-path nodes between
    them. No other call may run one of those again: its saved tensors are gone after the
    first run, and recompute allows each node one run in W (`GraphExecGroup`). Merging such
    calls keeps W correct (every cut node is pinned to its B gradient) at the price of the
    input gradient between them."""
    while True:
        owner: dict[Node, _WeightCall] = {}
        for call in calls:
            clash = next((owner[node] for node in _span(call, graph, input_path)
                          if owner.setdefault(node, call) is not call), None)
            if clash is not None:
                clash.cut_nodes += call.cut_nodes
                clash.weights += call.weights
                calls = [c for c in calls if c is not call]
                break
        else:
            return calls


def _span(call: _WeightCall, graph: _Graph, input_path: set[Node]) -> set[Node]:
    """The input-path nodes the call runs: its cut nodes, and the nodes on the way from one
    of them down to another (gradient flows that way toward the call's weights)."""
    cut_nodes = set(call.cut_nodes)
    if len(cut_nodes) == 1:
        return cut_nodes
    return (graph.below(cut_nodes, within=input_path)
            & graph.reaching(cut_nodes, within=input_path))
