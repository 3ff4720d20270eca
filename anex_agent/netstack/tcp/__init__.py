"""TCP (RFC 9293) split by concern: :mod:`.segment` (wire format and options), :mod:`.rtt`
(RFC 6298 retransmission timer), :mod:`.timestamps`, :mod:`.cubic`, :mod:`.rack`,
:mod:`.pacing`, :mod:`.autotune`, :mod:`.reassembly`, :mod:`.scoreboard` (pure algorithms),
:mod:`.connection` (the state machine) with its :mod:`.sender`, :mod:`.receiver` and
:mod:`.recovery`, :mod:`.states` (names), :mod:`.events` (what a connection hands its owner).
Nothing here imports the stack that drives it."""
