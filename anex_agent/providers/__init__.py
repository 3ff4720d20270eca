"""The machine providers, both sides of each: offers for the selection and rentals for provisioning.

- :mod:`.offers`: the offer-source contract (``name``, ``offers(filters)``); :mod:`.offers_http` the HTTP
  client the offer sources share.
- :mod:`.rentals`: the rental contract between the provisioning loop and a provider;
  :mod:`.rentals_http` how rental HTTP outcomes map onto its errors.
- :mod:`.vastai`, :mod:`.runpod`: each provider's ``offers`` and ``rentals``.
- :mod:`.onprem`: on-prem offers (GPU servers registered with the coordinator).

Used by the coordinator's selection and provisioning; imports no other role.
"""
