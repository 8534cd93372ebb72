"""Hugging Face interop: Llama, Mixtral and GPT-2 checkpoints (config.json + safetensors) in
and out.

    cfg, state = read_hf("path/to/hf-dir")     # a ModelConfig and the full single-device state
    reader = HFReader("path/to/hf-dir")        # or one region at a time: reader.region(...)
    write_hf("out-dir", cfg, state)            # a directory transformers' from_pretrained loads

`state` is keyed by `paraxis.model.transformer` parameter names (`tok_emb.weight`,
`blocks.0.attn.q.weight`,
...), one entry per parameter as `named_parameters()` lists them, so GPT-2's tied LM head
appears once, as `tok_emb.weight`. Any layout takes it from there: a pipeline stage, TP shard
or ZeRO-3 shard reads the regions it owns by name, and `write_hf` takes a callable that makes
one full tensor at a time, so neither direction needs the whole model in memory. Nothing here
downloads, and only safetensors are read: unpickling a `pytorch_model.bin` can execute code.

The pieces: `hf_names` (where each parameter lives in a Hugging Face file, and the
conventions checked against transformers), `hf_read` and `hf_write`.
"""

from paraxis.model.hf.names import expected_shapes
from paraxis.model.hf.read import HFReader, read_hf
from paraxis.model.hf.write import write_hf

__all__ = ["HFReader", "expected_shapes", "read_hf", "write_hf"]
