"""Runtime plumbing for the entry points: event-loop choice and helpers (:mod:`.eventloop`),
garbage-collector settings (:mod:`.gctune`), process-life directory locks (:mod:`.dirlock`)."""
