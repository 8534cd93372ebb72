"""Tools beside the package: the README's code map and the one-off probes (tools/probes)."""
