"""The model and what holds its weights: the transformer, initial weights, pipeline stages,
checkpoints, Hugging Face interop, inference and a router's choices on real text."""
