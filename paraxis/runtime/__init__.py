"""The parallel runtime (imports torch): process groups, engines, parallel layers."""
