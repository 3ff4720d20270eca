"""The Linux plumbing under the engines, blocking calls run off the event loop by their callers.

:mod:`.rtnl` (just enough rtnetlink), :mod:`.netconf` (addresses, routes, MTU, link state),
:mod:`.uapi` (wireguard-go's userspace API), :mod:`.caps` (capabilities and the TUN device),
:mod:`.process` (engine child processes that die with us)."""
