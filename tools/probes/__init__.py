"""One-off probes: each measures what a sentence of the docs states (tools/probes/README.md)."""
