"""Engines: the training step's contract and its one-device form (`contract`), and the
data-parallel and pipeline engines that implement it for dp > 1 and pp > 1."""
