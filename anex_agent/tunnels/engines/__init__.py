"""The WireGuard engines: the contract every engine provides (:mod:`.base`), what it is given (:mod:`.config`)
and reports (:mod:`.status`), the peer diff (:mod:`.peer_plan`), interface names (:mod:`.ifnames`), the
engine choice (:mod:`.registry`), and its four implementations
(:mod:`.kernel`, :mod:`.wireguard_go`, :mod:`.userspace`, :mod:`.wireproxy` with its config, metrics and
process), the endpoint policy they share (:mod:`.endpoints`), the ``detect`` report (:mod:`.detect`) and
``cleanup`` of what a crash left (:mod:`.cleanup`)."""
