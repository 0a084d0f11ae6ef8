"""Running readings: an engine (a backend with its settings), a document cut into chunks
for it (session), questions answered with traces (ask), many at once (batch)."""
