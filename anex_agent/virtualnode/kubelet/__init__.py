"""The virtual node's kubelet API: the port the API server proxies logs, exec, port-forward and stats to."""
