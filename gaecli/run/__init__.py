"""The one run driver of the commands and the engine-level passes it runs (:mod:`.passes`)."""
