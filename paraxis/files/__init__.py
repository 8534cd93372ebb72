"""Files and consoles, no torch: the checkpoint manifest and ownership, the Hugging Face
config, run records, traces, the host's steal counter and the terminal."""
