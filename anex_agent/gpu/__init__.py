"""GPU telemetry through NVML (nvidia-ml-py), host telemetry through psutil, health and qualification."""
