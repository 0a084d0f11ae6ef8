"""memagent: answer questions about book-scale documents with a MemAgent model."""

__version__ = "0.1.0"
