"""The axes' building blocks, below the model: tensor parallelism (`tensor`), context
parallelism and document packing (`context`), mixtures of experts and expert parallelism
(`experts`)."""
