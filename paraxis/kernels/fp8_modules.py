"""Point a model's FP8 projections at their FP8 GEMMs: the step `parallelize` runs under an
FP8 policy, after tensor parallelism, context parallelism and experts have split the model,
so it runs on every layout's per-rank part.

Each projection the policy names (`PrecisionPolicy.fp8_gemms`; not the output layer, not
the router) gets an `Fp8Gemm`: a plain `nn.Linear` becomes an `Fp8Linear` holding the same
Parameters, a tensor-parallel layer takes it as its `fp8` attribute (its `FP8_SPLIT` says
which of its features the TP group splits). The token groups are those that split the
tokens one device's GEMM sees: context parallelism's (`tokens`; for routed experts under
expert parallelism none, `convert_to_fp8`), and in a mixture of experts' block routed on
sequence shards its `shard_group` (tensor_parallel.apply.WholeExperts).
Nothing is read or allocated: it runs on the meta device.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from paraxis.kernels.fp8 import Fp8Gemm, Groups, runs_on_tensor_cores
from paraxis.kernels.linear import Fp8Linear
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import FP8_MIN_CAPABILITY, PrecisionPolicy, fp8_shape_problem


def check_fp8(policy: PrecisionPolicy, cfg: ModelConfig, tp: int, etp: int,
              device: torch.device) -> None:
    """One-line refusals before anything is built: a GPU without FP8 tensor cores, or a
    model whose FP8 weight dims (as each rank holds them) `_scaled_mm` cannot take."""
    if device.type == "cuda" and not runs_on_tensor_cores(device):
        have = ".".join(map(str, torch.cuda.get_device_capability(device)))
        need = ".".join(map(str, FP8_MIN_CAPABILITY))
        raise ParaxisError(f"--precision {policy.name} needs FP8 tensor cores (compute "
                           f"capability {need} or more: Ada, Hopper, Blackwell); "
                           f"{torch.cuda.get_device_name(device)} has {have}; use --precision "
                           "bf16")
    if problem := fp8_shape_problem(cfg, tp, etp, policy.name):
        raise ParaxisError(problem)


def convert_to_fp8(model: nn.Module, policy: PrecisionPolicy, tokens: Groups = (),
                   expert_tokens: Groups = ()) -> list[str]:
    """Give every projection of `model` named by `policy.fp8_gemms` its FP8 GEMM, in place.
    tokens: the groups splitting every GEMM's tokens (context parallelism's); expert_tokens:
    those splitting a routed expert's (the same without expert parallelism; with it an
    expert's rows come from its ep group, and the other ranks holding it, which split the
    tokens further, are treated as data-parallel ranks are: each its own amax). Returns the
    names converted."""
    patterns = [_pattern(text) for text in policy.fp8_gemms]
    converted = []
    for name, module in list(model.named_modules()):
        if not any(p.match(name) for p in patterns):
            continue
        split = expert_tokens if ".experts." in name else tokens
        gemm = Fp8Gemm(policy.fp8_recipe, split + _shard_groups(model, name),
                       **_feature_groups(module))
        if isinstance(module, nn.Linear):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, Fp8Linear.from_linear(module, gemm))
        elif hasattr(module, "FP8_SPLIT"):
            module.fp8 = gemm
        else:
            raise ParaxisError(f"{name} ({type(module).__name__}) cannot run in FP8: only "
                               "nn.Linear and the tensor-parallel linears can")
        converted.append(name)
    return converted


def _feature_groups(module: nn.Module) -> dict[str, Groups]:
    """A tensor-parallel layer's group, as the splitter of its inputs or its outputs."""
    split = getattr(module, "FP8_SPLIT", None)
    return {} if split is None else {split: (module.group,)}


def _shard_groups(model: nn.Module, name: str) -> Groups:
    """The groups splitting the tokens of the block part `name` sits in beyond context
    parallelism: an MoE block routed on sequence shards has its `shard_group`."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        group = getattr(model.get_submodule(".".join(parts[:end])), "shard_group", None)
        if group is not None:
            return (group,)
    return ()


def _pattern(text: str) -> re.Pattern[str]:
    """A module-name pattern of `spec.precision.FP8_GEMMS` ("*": one name component)."""
    return re.compile("^" + r"\.".join("[^.]+" if part == "*" else re.escape(part)
                                       for part in text.split(".")) + "$")
