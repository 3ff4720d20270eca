"""Provisioning: the coordinator rents the machine its selection chose, boots the agent
on it, watches the node join, and destroys what nobody uses.

The seam between the provisioning loop and a provider is :mod:`anex_agent.providers.rentals`: every
provider (Vast.AI, RunPod) implements
:class:`~anex_agent.providers.rentals.RentalProvider`, and the loop knows nothing else about it.
"""
