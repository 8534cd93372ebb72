"""`paraxis generate` and the sampling under it: greedy decoding equals transformers'
`generate` token for token, sampling is seeded and honours top-k, long contexts are cropped."""

import shutil

import pytest
import torch

from paraxis.cli import main
from paraxis.model.hf import write_hf
from paraxis.model.inference import generate, load_for_inference
from paraxis.model.transformer import build_model
from paraxis.spec.model_config import ModelConfig

pytest.importorskip("transformers")

PROMPT = [5, 17, 99, 3, 42]


def transformers_greedy(path: str, prompt: list[int], new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                         min_new_tokens=0)
    return out[0, len(prompt):].tolist()


def test_greedy_equals_transformers_generate(hf_dir):
    _, model = load_for_inference(hf_dir)
    ours = generate(model, PROMPT, 30, temperature=0.0)
    assert len(ours) == 30 and len(set(ours)) > 1
    assert ours == transformers_greedy(hf_dir, PROMPT, 30)


def test_cli_greedy_text_equals_transformers(hf_llama, tiny_tokenizer, tmp_path, capsys):
    from tokenizers import Tokenizer

    checkpoint = shutil.copytree(hf_llama, tmp_path / "model")
    shutil.copy(tiny_tokenizer, checkpoint / "tokenizer.json")  # found without --tokenizer
    tokenizer = Tokenizer.from_file(tiny_tokenizer)
    prompt = tokenizer.encode("the cat sat").ids
    expected = tokenizer.decode(prompt + transformers_greedy(str(checkpoint), prompt, 12))
    args = ["generate", "--checkpoint", str(checkpoint), "--prompt", "the cat sat",
            "--temperature", "0", "--max-new-tokens", "12", "--device", "cpu"]
    assert main(args) == 0
    assert capsys.readouterr().out == expected + "\n"
    (checkpoint / "tokenizer.json").unlink()  # now only through the flag
    assert main([*args, "--tokenizer", tiny_tokenizer]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_sampling_is_seeded_and_stays_in_the_top_k(hf_gpt2):
    _, model = load_for_inference(hf_gpt2)
    sampled = generate(model, PROMPT, 20, temperature=1.0, top_k=3, seed=7)
    assert sampled == generate(model, PROMPT, 20, temperature=1.0, top_k=3, seed=7)
    assert sampled != generate(model, PROMPT, 20, temperature=1.0, top_k=0, seed=8)
    ids = PROMPT + sampled
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
    for position, token in enumerate(sampled, start=len(PROMPT) - 1):
        assert token in logits[position].topk(3).indices.tolist()
    # top-k of 1 leaves only the likeliest token: greedy, whatever the temperature and seed
    assert generate(model, PROMPT, 20, temperature=5.0, top_k=1, seed=3) == generate(
        model, PROMPT, 20, temperature=0.0)


def test_a_prompt_longer_than_the_context_is_cropped(hf_gpt2):
    cfg, model = load_for_inference(hf_gpt2)
    long_prompt = [i % cfg.vocab_size for i in range(cfg.max_seq_len + 20)]
    assert generate(model, long_prompt, 5) == generate(model, long_prompt[-cfg.max_seq_len:], 5)


def test_cli_errors_are_one_line(hf_gpt2, tmp_path, capsys):
    cfg = ModelConfig("wide-vocab", "gpt2", 512, 1, 32, 2, 2, 64, 32)
    write_hf(tmp_path / "wide", cfg, dict(build_model(cfg).named_parameters()))
    narrow = ModelConfig("ascii-vocab", "gpt2", 128, 1, 32, 2, 2, 64, 32)
    write_hf(tmp_path / "narrow", narrow, dict(build_model(narrow).named_parameters()))
    cases = [
        (["--checkpoint", str(tmp_path / "wide"), "--prompt", "hi"], "holds no tokenizer.json"),
        (["--checkpoint", str(tmp_path / "narrow"), "--prompt", "\u00e9"],  # bytes 195, 169
         "prompt token id 195 is outside the model's vocabulary of 128"),
        (["--checkpoint", hf_gpt2, "--prompt", "hi", "--temperature", "-1"],
         "--temperature -1.0 must be >= 0"),
        (["--checkpoint", str(tmp_path), "--prompt", "hi"], "holds neither config.json"),
    ]
    for args, message in cases:
        assert main(["generate", "--device", "cpu", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_paraxis_checkpoint_generates_what_its_hf_source_does(hf_gpt2, tmp_path):
    from paraxis.model.checkpoint.convert import import_hf
    from paraxis.spec.layout import Layout

    checkpoint = import_hf(hf_gpt2, tmp_path / "ckpt", Layout.parse("tp=2,pp=2"))
    cfg, model = load_for_inference(checkpoint)
    assert cfg.style == "gpt2"
    assert generate(model, PROMPT, 5) == generate(load_for_inference(hf_gpt2)[1], PROMPT, 5)


def test_a_run_trained_with_a_tokenizer_generates_through_it(tiny_tokenizer, tmp_path, capsys):
    """The checkpoint's config.toml names the tokenizer its run trained with: generate uses
    it unasked (it once fed such a model bytes), and says so in one line when it is gone."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. the dog sat on the log.\n" * 40)
    tokenizer = str(shutil.copy(tiny_tokenizer, tmp_path / "tok.json"))
    assert main(["train", "--model", "tiny", "--data", str(corpus), "--tokenizer", tokenizer,
                 "--steps", "2", "--global-batch", "2", "--seq-len", "16", "--quiet",
                 "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    args = ["generate", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "the cat",
            "--temperature", "0", "--max-new-tokens", "6", "--device", "cpu"]
    capsys.readouterr()
    assert main([*args, "--tokenizer", tokenizer]) == 0
    through_it = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == through_it
    assert main([*args, "--tokenizer", "bytes"]) == 0  # asked for: the byte-level one
    assert capsys.readouterr().out != through_it
    (tmp_path / "tok.json").unlink()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the run trained with tokenizer" in err and "give --tokenizer" in err


def test_bytes_can_be_asked_for_a_wide_vocabulary(tmp_path, capsys):
    cfg = ModelConfig("wide-vocab", "gpt2", 512, 1, 32, 2, 2, 64, 32)
    write_hf(tmp_path / "wide", cfg, dict(build_model(cfg).named_parameters()))
    assert main(["generate", "--checkpoint", str(tmp_path / "wide"), "--prompt", "hi",
                 "--tokenizer", "bytes", "--max-new-tokens", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == "hi\n"
