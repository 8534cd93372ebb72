"""Pipeline parallelism: the pipeline engine, which runs a stage's action list exactly as the
schedule generator wrote it (`executor`), over a data-parallel engine; a backward split into
B and W (`split_backward`), the tied embedding across stages (`tied`), ZeRO-3 under a
schedule (`zero3`) and activation memory measured (`memory`)."""
