"""Hugging Face interop for mixtures of experts: Mixtral directories import into paraxis with
transformers' logits (on-disk per-expert keys and transformers' fused in-memory form), a
paraxis MoE model exports to the files transformers itself writes, round trips are exact,
and what Mixtral's format cannot say is refused in one line.

The Mixtral model is a tiny random one made by transformers (`hf_mixtral` in conftest.py).
`layout_logits` runs the imported model at a rank's layout (pipeline stages, TP inside
them, experts sharded over ep and reached by all-to-all as the runtime does), so tp=2 x
pp=2 and ep=2 x pp=2 compare with `hf_logits`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.model.hf import HFReader, read_hf, write_hf
from paraxis.model.inference import model_from_state
from paraxis.model.transformer import build_model, single_device_parameters
from paraxis.parallel.experts.expert_parallel import AllToAllCounter, shard_experts
from paraxis.parallel.experts.layer import moe_layers
from paraxis.parallel.tensor import apply_tensor_parallel
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS
from paraxis.spec.partition import partition_layers

transformers = pytest.importorskip("transformers")

IDX = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def stored(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files, by its stored name."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


@pytest.fixture(scope="module")
def fused_mixtral(hf_mixtral: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same model as transformers holds it in memory (`mlp.experts.gate_up_proj`, ...),
    written as it is: a form transformers also loads."""
    from safetensors.torch import save_file

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_mixtral)
    path = tmp_path_factory.mktemp("hf") / "mixtral-fused"
    path.mkdir()
    shutil.copy(Path(hf_mixtral) / "config.json", path)
    save_file({name: t.contiguous() for name, t in model.state_dict().items()},
              path / "model.safetensors", metadata={"format": "pt"})
    assert "model.layers.0.mlp.experts.gate_up_proj" in stored(path)
    return str(path)


def test_config_carries_the_experts(hf_mixtral):
    cfg, state = read_hf(hf_mixtral)
    assert (cfg.n_experts, cfg.top_k, cfg.d_ff_expert, cfg.n_shared_experts) == (4, 2, 48, 0)
    assert (cfg.first_dense_layers, cfg.capacity_factor, cfg.aux_loss_coef) == (0, 0.0, 0.02)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.rope_theta, cfg.max_seq_len) == (4, 2, 50000.0, 64)
    assert state["blocks.1.moe.router.weight"].shape == (4, 64)
    assert state["blocks.1.moe.experts.3.down.weight"].shape == (64, 48)


@pytest.mark.parametrize("form", ["per-expert", "fused"])
def test_import_matches_transformers_on_one_device(form, hf_mixtral, fused_mixtral, hf_logits):
    path = hf_mixtral if form == "per-expert" else fused_mixtral
    cfg, state = read_hf(path)
    model = model_from_state(cfg, state).eval()
    with torch.no_grad():
        ours = model(IDX)
    # every expert of every block takes tokens, so each expert's weights reach the logits
    assert all(bool((layer.last_counts > 0).all()) for layer in moe_layers(model))
    assert max_diff(ours, hf_logits(hf_mixtral, IDX)) <= 1e-5


def layout_logits(ctx: RankContext, hf_dir: str, idx: torch.Tensor) -> torch.Tensor | None:
    """The full logits of the imported model on the last pipeline stage (None elsewhere):
    each rank builds its stage, keeps its experts as the runtime does (`shard_experts`:
    under ep the others are reached by all-to-all), copies the imported weights in by name
    (experts by their global index, so a rank holding some experts takes just theirs),
    splits them for TP, and runs its part; the last stage gathers the vocab-parallel
    logits."""
    cfg, state = read_hf(hf_dir)
    groups, split = ctx.groups, partition_layers(cfg, ctx.layout.pp)
    stage = build_model(cfg, seed=9, blocks=split.blocks_of(groups.pp_rank),
                        embed=split.has_embedding(groups.pp_rank),
                        head=split.has_head(groups.pp_rank))
    shard_experts(stage, cfg.n_experts, ctx.layout.ep, groups.ep_rank, groups.ep_group,
                  groups.replica_group)
    with torch.no_grad():
        for name, param in single_device_parameters(stage):
            param.copy_(state[name])
    apply_tensor_parallel(stage, groups)
    stage.eval()
    with torch.no_grad():
        inputs = idx
        if not groups.is_first_stage:
            inputs = torch.empty(*idx.shape, cfg.d_model)
            dist.recv(inputs, groups.prev_stage_rank)
        out = stage(inputs)
        if not groups.is_last_stage:
            dist.send(out.contiguous(), groups.next_stage_rank)
            return None
        if groups.tp_group is None:
            return out
        pieces = [torch.empty_like(out) for _ in range(ctx.layout.tp)]
        dist.all_gather(pieces, out.contiguous(), group=groups.tp_group)
        return torch.cat(pieces, dim=-1)


def test_import_at_tp2_pp2_matches_transformers(hf_mixtral, hf_logits):
    expected = hf_logits(hf_mixtral, IDX)
    results = run_on_ranks("tp=2,pp=2", layout_logits, hf_mixtral, IDX)
    assert results[:2] == [None, None]  # ranks 0, 1: the first stage
    for logits in results[2:]:  # ranks 2, 3: the last stage, both TP ranks
        assert max_diff(logits, expected) <= 1e-5


def _counted_logits(ctx: RankContext, hf_dir: str, idx: torch.Tensor
                    ) -> tuple[torch.Tensor | None, int]:
    """`layout_logits`, with the bytes this rank's all-to-alls sent to the other EP rank."""
    with AllToAllCounter() as counter:
        logits = layout_logits(ctx, hf_dir, idx)
    return logits, counter.nbytes()


def test_import_at_ep2_pp2_matches_transformers(hf_mixtral, hf_logits):
    """dp=2 x ep=2 x pp=2: each rank holds 2 of the 4 experts of its stage's block, and the
    tokens routed to the other 2 travel to the other EP rank and back (bytes counted on
    every rank: the all-to-all ran)."""
    expected = hf_logits(hf_mixtral, IDX)
    results = run_on_ranks("dp=2,ep=2,pp=2", _counted_logits, hf_mixtral, IDX)
    assert all(nbytes > 0 for _, nbytes in results)
    last = [logits for logits, _ in results if logits is not None]
    assert len(last) == 2  # the last stage of each dp replica
    for logits in last:
        assert max_diff(logits, expected) <= 1e-5


def test_both_forms_read_the_same_regions(hf_mixtral, fused_mixtral):
    per_expert, fused = HFReader(hf_mixtral), HFReader(fused_mixtral)
    for name in per_expert.names:
        assert torch.equal(per_expert.full(name), fused.full(name)), name
    # a TP or ZeRO-3 rank reads part of an expert: the rows of `up` sit past the gate's
    rows = (slice(5, 17), slice(3, 40))
    for name in ("blocks.1.moe.experts.2.up.weight", "blocks.0.moe.experts.3.down.weight"):
        assert torch.equal(fused.region(name, rows), per_expert.full(name)[rows])


def test_paraxis_moe_exports_what_transformers_writes(hf_logits, tmp_path):
    cfg = PRESETS["tiny-moe"]
    model = build_model(cfg, seed=4).eval()
    out = write_hf(tmp_path / "tiny-moe", cfg, model.state_dict(), max_shard_bytes=200_000)
    assert len(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
               ) == len(stored(out))
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert max_diff(hf_logits(str(out), idx), model(idx)) <= 1e-5
    # transformers saves what it loaded under exactly our names and values
    transformers.AutoModelForCausalLM.from_pretrained(out).save_pretrained(tmp_path / "again")
    ours, theirs = stored(out), stored(tmp_path / "again")
    assert sorted(ours) == sorted(theirs)
    assert "model.layers.3.block_sparse_moe.experts.7.w3.weight" in ours
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_round_trips_are_exact(hf_mixtral, tmp_path):
    cfg, state = read_hf(hf_mixtral)
    cfg_again, state_again = read_hf(write_hf(tmp_path / "again", cfg, state))
    assert cfg_again == cfg.replace(name="again")
    assert state_again.keys() == state.keys()
    assert all(torch.equal(state_again[name], state[name]) for name in state)
    # from paraxis: Mixtral has one MLP width, the experts' (tiny-moe's dense d_ff is unused)
    tiny = PRESETS["tiny-moe"]
    params = dict(build_model(tiny, seed=1).named_parameters())
    back, tensors = read_hf(write_hf(tmp_path / "tiny", tiny, params))
    assert back == tiny.replace(name="tiny", d_ff=tiny.d_ff_expert)
    assert all(torch.equal(tensors[name], params[name]) for name in params)


def test_a_checkpoint_imported_from_mixtral_exports_transformers_own_files(hf_mixtral,
                                                                          tmp_path):
    from paraxis.model.checkpoint.convert import export_hf, import_hf

    checkpoint = import_hf(hf_mixtral, tmp_path / "imported")
    exported = export_hf(checkpoint, tmp_path / "exported")
    ours, theirs = stored(exported), stored(Path(hf_mixtral))
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_training_starts_from_a_mixtral_directory(hf_mixtral, hf_logits):
    """`--model DIR --init-from DIR`: the first loss is transformers' on the same batch."""
    import torch.nn.functional as F

    from paraxis.data.corpus import TokenData
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    cfg = RunConfig.from_flags(model=hf_mixtral, steps=1, global_batch=4, seq_len=32,
                               quiet=True, init_from=hf_mixtral)
    loss = run_training(cfg)[0]["loss"]
    inputs, targets = TokenData.load("embedded").batch(0, 4, 32, seed=0)
    logits = hf_logits(hf_mixtral, torch.from_numpy(inputs))
    expected = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(targets).flatten())
    assert loss == pytest.approx(float(expected), rel=1e-5)


def edited(hf_mixtral: str, tmp_path: Path, changes: dict, dropped: tuple[str, ...] = ()
           ) -> Path:
    """A copy of the Mixtral directory with config.json changed and keys `dropped`."""
    path = tmp_path / "edited"
    shutil.copytree(hf_mixtral, path)
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    for key in dropped:
        del config[key]
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(("changes", "dropped", "message"), [
    ({"sliding_window": 32}, (), r"sliding_window 32 \(paraxis attends to the whole sequence"),
    ({"router_jitter_noise": 0.1}, (), "router_jitter_noise 0.1"),
    ({}, ("num_local_experts",), "missing key 'num_local_experts'"),
])
def test_what_paraxis_cannot_reproduce_is_refused(changes, dropped, message, hf_mixtral,
                                                  tmp_path):
    with pytest.raises(ParaxisError, match=message) as error:
        read_hf(edited(hf_mixtral, tmp_path, changes, dropped))
    assert "\n" not in str(error.value)


def test_a_window_as_long_as_the_sequences_is_refused_too(hf_mixtral, tmp_path):
    """paraxis trains RoPE models past max_position_embeddings, where a window of that length
    would bind: the user sets it to null, which changes nothing up to that length."""
    with pytest.raises(ParaxisError, match="set sliding_window to null .a window of "
                                           "max_position_embeddings or more changes nothing"):
        read_hf(edited(hf_mixtral, tmp_path, {"sliding_window": 64}))


@pytest.mark.parametrize(("changes", "field"), [
    ({"n_shared_experts": 1}, "n_shared_experts"),
    ({"first_dense_layers": 1}, "first_dense_layers"),
])
def test_exports_mixtral_cannot_hold_are_refused_and_write_nothing(changes, field, tmp_path):
    cfg = PRESETS["tiny-moe"].replace(**changes)
    model = build_model(cfg, seed=0)
    with pytest.raises(ParaxisError, match=f"{field}=1.*{field} 0") as error:
        write_hf(tmp_path / "out", cfg, model.state_dict())
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []
