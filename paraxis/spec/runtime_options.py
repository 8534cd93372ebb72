"""How the runtime runs a layout, beside the Layout itself: one value handed from the run
config to `parallelize` and on to the engines, where each setting would otherwise be a
keyword passed through every signature between them."""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.spec.optimizer import DEFAULT_ADAMW, AdamW
from paraxis.spec.precision import PrecisionPolicy
from paraxis.spec.units import DEFAULT_BUCKET_BYTES


@dataclass(frozen=True)
class RuntimeOptions:
    # the precision policy every axis follows (`spec.precision`: a preset's name or a policy)
    precision: str | PrecisionPolicy = "fp32"
    # AdamW's hyperparameters besides the learning rate
    adamw: AdamW = DEFAULT_ADAMW
    # gradient buckets of ZeRO-0/1/2 and of the partial gradients' sum over tp (ZeRO-3
    # reduces one block at a time)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    # torch.compile the model whole where it can (`parallelize.compiles_whole`), else each
    # block
    compile: bool = False
    # pack documents ending at this token id (`parallel.context.packing`); None: no packing
    end_of_document: int | None = None
    # the LM head and the loss as one kernel that never holds the logits
    # (`parallel.tensor.cross_entropy.linear_cross_entropy`)
    fused_loss: bool = False
    # ZeRO-3 all-gathers the blocks' FP8 weights in FP8 (`engine.data_parallel.fp8_gather`)
    fp8_weight_gather: bool = False


DEFAULT_OPTIONS = RuntimeOptions()
