"""Reports a person opens in a browser: one self-contained HTML file per report, for runs
(`trace --html`, `ask --report`: traces.py) and for evaluations (`eval report --html`:
evaluation.py), each a page of _page.py.

Inline CSS and inline SVG, no script and nothing fetched: a Content-Security-Policy forbids
scripts, frames, images and every other request, so a report opens from disk, offline, and
prints. The renderers are pure functions of trace records and results files; every text
that comes from a document, a model or a file is escaped, so a memory holding `<script>` or
`javascript:` shows as those characters, and printable (memagent_cli/text.py), as on a
terminal.
"""

from memagent_cli.views.html._page import CSS, POLICY, check_writable, escape, write
from memagent_cli.views.html.evaluation import eval_report
from memagent_cli.views.html.traces import trace_report

__all__ = ["CSS", "POLICY", "check_writable", "escape", "eval_report", "trace_report", "write"]
