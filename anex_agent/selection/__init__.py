"""Machine selection from pod annotations across Vast.AI, RunPod and on-prem nodes."""
