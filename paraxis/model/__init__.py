"""The model and what holds its weights: the transformer, initial weights, pipeline stages,
checkpoints and Hugging Face interop."""
