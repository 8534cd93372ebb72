"""AdamW's defaults: the run config's, and every engine's when a caller gives none.

As GPT-3 trained (Brown et al. 2020, appendix B: beta2 0.95, weight decay 0.1), and
Megatron-LM's and torchtitan's defaults; eps is PyTorch's.
"""

WEIGHT_DECAY = 0.1
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
