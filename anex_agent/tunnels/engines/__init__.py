"""The WireGuard engines: the contract every engine provides (:mod:`.base`) and its four implementations
(:mod:`.kernel`, :mod:`.wireguard_go`, :mod:`.userspace`, :mod:`.wireproxy` with its config, metrics and
process), the endpoint policy they share (:mod:`.endpoints`), the ``detect`` report (:mod:`.detect`) and
``cleanup`` of what a crash left (:mod:`.cleanup`)."""
