"""`memagent eval`: reproduce the paper's long-context results with any model.

data (the authors' evaluation files) -> one ordinary run per case -> scoring (as the
authors' `ruler_hqa.py`) -> results (JSON Lines, resumable) -> report (table, JSON, plot).
`niah` builds RULER-style needle cases from any document.
"""
