"""What every device benchmark records about where it ran, so its numbers can be compared
only with numbers from the same device, torch and load."""

from __future__ import annotations

import os
from typing import Any

import torch


def device_fields(device: torch.device) -> dict[str, Any]:
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()),
    }
