"""Which hardware a report prices, so that a forecast compares like with like.

A plan alone is for the GPUs it names (a preset, or a --hardware file). A run is forecast
on the hardware it ran on: the --hardware file or --gpu preset given for it, else this
machine (a report is written where its run ran, as `paraxis demo` does): its GPU's preset
on a CUDA machine, and on a CPU a profile of this CPU (`paraxis.train.calibrate.quick`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from paraxis.plan.hardware import GPU, GPUS, Cluster
from paraxis.plan.inputs import DEFAULT_GPU, PlanInputs
from paraxis.spec.errors import ParaxisError
from paraxis.train.calibrate.quick import profile_for_cpu_run


def gpu_for_device_name(device_name: str) -> GPU | None:
    """The preset for a CUDA device name such as "NVIDIA H100 80GB HBM3" (None if unknown):
    how a run's MFU finds the peak it is measured against."""
    text = device_name.lower().replace(" ", "")
    for markers, preset in ((("h200",), "h200"), (("h100", "pcie"), "h100-pcie-80gb"),
                            (("h100",), "h100-sxm-80gb"), (("a100", "80g"), "a100-80gb"),
                            (("a100",), "a100-40gb"), (("v100",), "v100-32gb"),
                            (("l40s",), "l40s")):
        if all(marker in text for marker in markers):
            return GPUS[preset]
    return None


@dataclass(frozen=True)
class Hardware:
    inputs: PlanInputs  # with the hardware file or GPU preset the report prices filled in
    cpu: bool  # ranks are CPU processes sharing a machine's cores and memory
    name: str  # what the ranks ran on, for the title: "a100-80gb", "AMD EPYC (2 cores)"
    source: str  # one sentence: where the prices come from

    def ranks(self, count: int) -> str:
        """ "8 x a100-80gb" or "8 CPU ranks on AMD EPYC (2 cores)"."""
        if self.cpu:
            return f"{count} CPU rank{'s' if count > 1 else ''} on {self.name}"
        return f"{count} x {self.name}"

    @property
    def device(self) -> str:
        """What one rank runs on, in labels: "GPU", or "rank" for a CPU rank."""
        return "rank" if self.cpu else "GPU"


def is_cpu(cluster: Cluster) -> bool:
    """CPU ranks time-share their node's cores (Cluster.cores_per_node); GPUs own theirs."""
    return cluster.cores_per_node > 0


def choose_hardware(inputs: PlanInputs, run_dir: Path | None, world_size: int,
                    model: str) -> Hardware:
    """The hardware the report prices (module docstring); a CPU profile may be calibrated
    now for `world_size` ranks of `model`, kept in the run's folder where it can be written
    (`calibrate.quick.save_profile`)."""
    if inputs.hardware:
        return _from_file(inputs, Path(inputs.hardware), "the file given with --hardware")
    if inputs.gpu or run_dir is None:
        gpu = inputs.gpu or DEFAULT_GPU
        return Hardware(dataclasses.replace(inputs, gpu=gpu), False, gpu,
                        f"the {gpu} preset (datasheet figures, paraxis/plan/hardware.py)")
    import torch  # lazy: torch, only to see what this machine runs on

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
        preset = gpu_for_device_name(device)
        if preset is None:
            raise ParaxisError(f"no GPU preset matches {device!r}; give --gpu or --hardware "
                               "(a `paraxis calibrate` profile) for the run's forecast")
        return Hardware(dataclasses.replace(inputs, gpu=preset.name), False, preset.name,
                        f"the {preset.name} preset, the GPU this machine has ({device})")
    found = profile_for_cpu_run(world_size, run_dir, model, inputs.seq_len or 128)
    return _from_file(inputs, found.path, found.describe())


def _from_file(inputs: PlanInputs, path: Path, source: str) -> Hardware:
    inputs = dataclasses.replace(inputs, hardware=str(path))
    cluster = inputs.cluster()
    if not is_cpu(cluster):
        return Hardware(inputs, False, cluster.gpu.name, source)
    try:
        device = json.loads(path.read_text()).get("calibration", {}).get("device", {})
    except (OSError, ValueError):  # a TOML file: Cluster already read it
        device = {}
    cpu = device.get("model", cluster.gpu.name)
    return Hardware(inputs, True, f"{cpu} ({cluster.cores_per_node} cores)", source)
