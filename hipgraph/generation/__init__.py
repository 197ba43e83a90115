"""Generator handoff: cited context from hits, generator backends, ``answer()`` composition."""
