"""What is shown to a person: consoles, progress, and the views of traces, models,
inspections and evaluations. Nothing below this layer prints."""
