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
computes only the dA matmuls: B + W costs about 2F, as the fused backward does.

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

Activation recompute (`torch.utils.checkpoint`, non-reentrant) recomputes a block once per
backward call: once in B and, under one `GraphExecGroup`, once for all of W's calls. With full
recompute, B + W therefore costs one forward more than a fused backward.

Memory: B keeps the graph (`retain_graph=True`) for W, so a chunk whose W is pending holds its
activations, including those only B needed (eager autograd cannot free a node's saved tensors
selectively); W frees them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge
from torch.utils.checkpoint import GraphExecGroup

from paraxis.errors import ParaxisError

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
            handles = [node.register_prehook(lambda _, grads=self.received.get(i): grads)
                       for i, node in enumerate(self.cut_nodes) if i in self.received]
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
    """
    trainable = [w for w in weights if w.requires_grad]
    weight_nodes = {get_gradient_edge(w).node: w for w in trainable}
    if outputs.grad_fn is None or inputs is None or not inputs.requires_grad:
        return None, _whole_backward(outputs, grad_outputs, trainable)
    input_node = get_gradient_edge(inputs).node
    children, order = _walk(outputs.grad_fn, input_node)
    input_path = _reaching(children, order, {input_node})
    if outputs.grad_fn not in input_path:  # the output does not depend on the input
        return None, _whole_backward(outputs, grad_outputs, trainable)
    calls = _group_cut_nodes(children, order, input_path, weight_nodes)
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


def _walk(root: Node, stop: Node) -> tuple[dict[Node, list[Node]], list[Node]]:
    """Every node reachable from `root` (not beyond `stop`) with its children, in the order
    a depth-first walk meets them: the same on every rank, which keeps W's calls (and any
    collective inside them, as tensor parallelism's) in one order everywhere."""
    children: dict[Node, list[Node]] = {}
    order: list[Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node in children:
            continue
        kids = [] if node is stop else [n for n, _ in node.next_functions if n is not None]
        children[node] = kids
        order.append(node)
        stack.extend(reversed(kids))
    return children, order


def _reaching(children: dict[Node, list[Node]], order: list[Node], targets: set[Node],
              within: set[Node] | None = None) -> set[Node]:
    """The nodes (of `within`, default all) from which one of `targets` is reachable, the
    targets included."""
    parents: dict[Node, list[Node]] = {}
    for node in order:
        for kid in children[node]:
            parents.setdefault(kid, []).append(node)
    found = {t for t in targets if t in children}
    frontier = list(found)
    while frontier:
        node = frontier.pop()
        for parent in parents.get(node, ()):
            if parent not in found and (within is None or parent in within):
                found.add(parent)
                frontier.append(parent)
    return found


def _group_cut_nodes(children: dict[Node, list[Node]], order: list[Node],
                     input_path: set[Node], weight_nodes: dict[Node, torch.Tensor]
                     ) -> list[_WeightCall]:
    """The cut nodes, grouped by touching weight sides, each group with its weights."""
    off_path = {node for node in order if node not in input_path}
    weight_side = _reaching(children, order, set(weight_nodes), within=off_path)
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
    for node in order:
        below = [kid for kid in children[node] if kid in weight_side]
        if below and node in input_path:
            cut_nodes.append(node)
        if below and (node in input_path or node in weight_side):
            for kid in below:
                leader[find(kid)] = find(node)
    calls: dict[Node, _WeightCall] = {}  # by leader, in the order the walk met them
    for node in cut_nodes:
        calls.setdefault(find(node), _WeightCall([], [])).cut_nodes.append(node)
    for node in order:
        if node in weight_nodes:
            calls[find(node)].weights.append(weight_nodes[node])
    return list(calls.values())
