"""Files and consoles, no torch: model files and the Hugging Face config, the checkpoint
manifest and ownership, run records, traces, this host's folders, memory and steal counter,
and the terminal."""
