"""TCP (RFC 9293) split by concern: :mod:`.segment` (wire format and options), :mod:`.rtt`
(RFC 6298 retransmission timer), :mod:`.reassembly` (out-of-order data), :mod:`.connection`
(the state machine, flow and congestion control)."""
