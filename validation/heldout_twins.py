"""llm-foundry's A100 80GB and 40GB tables side by side (docs/validation.md, finding 6)."""

from __future__ import annotations

from validation.heldout_llm_foundry import LLM_FOUNDRY
from validation.validate_heldout import HeldOutResult


def twin_lines(priced: list[HeldOutResult]) -> list[str]:
    """llm-foundry's A100 80GB and 40GB tables side by side (finding 6): the same model,
    sequence and checkpointing on 8 GPUs of one chip, published against predicted."""
    rows = {(r.run.gpu, r.run.model.name, r.run.seq_len, r.run.recompute): r for r in priced
            if r.run.source.startswith(LLM_FOUNDRY) and r.run.gpus == 8}
    lines = ["llm-foundry's A100 80GB table over its A100 40GB table, the same model, sequence",
             "and checkpointing on 8 GPUs (tokens/s per GPU, published and predicted; the",
             "chips differ in memory and HBM bandwidth, the rows in microbatch x accumulation;",
             "FSDP's gathers and reduce-scatters: the 40GB rows' all, hidden or not, over their",
             "predicted steps):", ""]

    def span(values: list[float], form: str = ".2f") -> str:
        return f"{min(values):{form}}-{max(values):{form}}"

    for recompute in ("none", "full"):
        pairs = [(big, rows[("a100-40gb", *key[1:])]) for key, big in rows.items()
                 if key[0] == "a100" and key[3] == recompute and ("a100-40gb", *key[1:]) in rows]
        published = [big.run.tokens_per_gpu_s / small.run.tokens_per_gpu_s
                     for big, small in pairs]
        predicted = [big.tokens_per_gpu_s / small.tokens_per_gpu_s for big, small in pairs]
        micro = [small.run.micro_batch / big.run.micro_batch for big, small in pairs]
        steps = [(big.run.local_batch // big.run.micro_batch,
                  small.run.local_batch // small.run.micro_batch) for big, small in pairs]
        sync = [small.estimate.time["dp_total"] / small.estimate.step_time_s
                for _, small in pairs]
        lines.append(
            f"- checkpointing {recompute} ({len(pairs)} pairs): published {span(published)}x, "
            f"predicted {span(predicted)}x; the 40GB microbatch {span(micro)}x the 80GB's, "
            f"{span([s[1] for s in steps], 'd')} accumulation steps against "
            f"{span([s[0] for s in steps], 'd')}; FSDP's traffic {span(sync, '.1%')} of the "
            "40GB step")
    return lines + [""]
