"""Runtime plumbing for the entry points: event-loop choice and helpers (:mod:`.eventloop`),
garbage-collector settings (:mod:`.gctune`), process-life directory locks (:mod:`.dirlock`),
long jobs a step per loop turn (:mod:`.turnqueue`), the peer a request came from
(:mod:`.origin`)."""
